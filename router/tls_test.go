package router

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/mtls"
)

// TestNewTLSIdentity: a router's certificate must be a router's, and the
// router's id is the certificate's name.
func TestNewTLSIdentity(t *testing.T) {
	dir := t.TempDir()
	if _, err := mtls.CreateCA(filepath.Join(dir, "ca"), mtls.CAOptions{}); err != nil {
		t.Fatal(err)
	}
	files := func(role mtls.Role, name string) mtls.Files {
		cert, key, err := mtls.CreateCert(filepath.Join(dir, "ca"), filepath.Join(dir, string(role)), mtls.Identity{Role: role, Name: name}, mtls.CertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return mtls.Files{CA: filepath.Join(dir, "ca", mtls.CAFile), Cert: cert, Key: key}
	}
	tests := []struct {
		name    string
		files   mtls.Files
		id      string
		wantID  string
		wantErr string
	}{
		{"id from the certificate", files(mtls.RoleRouter, "edge-1"), "", "edge-1", ""},
		{"the same id given", files(mtls.RoleRouter, "edge-2"), "edge-2", "edge-2", ""},
		{"another id given", files(mtls.RoleRouter, "edge-3"), "edge-9", "", "--id edge-9 differs from the name in --tls-cert"},
		{"an agent's certificate", files(mtls.RoleAgent, "gpu-1"), "", "", "is the certificate of agent/gpu-1; a router needs one of role router"},
		{"an admin's certificate", files(mtls.RoleAdmin, "ops"), "", "", "a router needs one of role router"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.ID, c.TLS = tt.id, tt.files
			r, err := New(c, slog.New(slog.DiscardHandler))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.tok.Close()
			if r.cfg.ID != tt.wantID {
				t.Fatalf("router id %q, want %q", r.cfg.ID, tt.wantID)
			}
		})
	}
}
