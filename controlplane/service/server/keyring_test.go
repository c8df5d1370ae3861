package server

import (
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/gossip"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func key(b byte) []byte { return []byte(strings.Repeat(string(rune(b)), 32)) }

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// TestLocalKeyring: each operation on a real keyring answers this server's
// keys (fingerprints, primary first) after it; an operation the keyring
// refuses is the answer's error, not the call's; a request no server could
// run is INVALID_ARGUMENT; a server without a keyring says so.
func TestLocalKeyring(t *testing.T) {
	k1, k2 := key('a'), key('b')
	fp1, fp2 := gossip.Fingerprint(k1), gossip.Fingerprint(k2)
	install := &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: b64(k2)}
	tests := []struct {
		name    string
		before  []*llmgwv1.KeyringRequest
		req     *llmgwv1.KeyringRequest
		code    codes.Code
		keys    []string // fingerprints, primary first
		errPart string   // in the answer's error
	}{
		{"list", nil, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST}, codes.OK, []string{fp1}, ""},
		{"install", nil, install, codes.OK, []string{fp1, fp2}, ""},
		{"use", []*llmgwv1.KeyringRequest{install}, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_USE, Key: b64(k2)}, codes.OK, []string{fp2, fp1}, ""},
		{"use a key not installed", nil, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_USE, Key: b64(k2)}, codes.OK, []string{fp1}, "not installed"},
		{"remove the primary", []*llmgwv1.KeyringRequest{install}, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_REMOVE, Key: b64(k1)}, codes.OK, []string{fp1, fp2}, "primary key"},
		{"remove", []*llmgwv1.KeyringRequest{install}, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_REMOVE, Key: b64(k2)}, codes.OK, []string{fp1}, ""},
		{"no op", nil, &llmgwv1.KeyringRequest{}, codes.InvalidArgument, nil, ""},
		{"bad key", nil, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: "AAAA"}, codes.InvalidArgument, nil, ""},
		{"key not base64", nil, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: "*"}, codes.InvalidArgument, nil, ""},
		{"list with a key", nil, &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST, Key: b64(k1)}, codes.InvalidArgument, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keyFile := filepath.Join(t.TempDir(), "key")
			if err := os.WriteFile(keyFile, []byte(b64(k1)), 0o600); err != nil {
				t.Fatal(err)
			}
			kr, err := gossip.OpenKeyring(t.TempDir(), keyFile)
			if err != nil {
				t.Fatal(err)
			}
			s := New(&fakeProposer{}, slog.New(slog.DiscardHandler)).WithKeyring("c1", kr)
			for _, b := range tt.before {
				if r, err := s.LocalKeyring(context.Background(), b); err != nil || r.Error != "" {
					t.Fatalf("%s: %v %v", b.Op, err, r)
				}
			}
			got, err := s.LocalKeyring(context.Background(), tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("err %v, want %s", err, tt.code)
			}
			if tt.code != codes.OK {
				return
			}
			if got.ServerId != "c1" || (tt.errPart == "") != (got.Error == "") || !strings.Contains(got.Error, tt.errPart) {
				t.Fatalf("answer %v, want server c1 and error %q", got, tt.errPart)
			}
			var fps []string
			for i, k := range got.Keys {
				if k.Primary != (i == 0) {
					t.Fatalf("key %d primary=%v", i, k.Primary)
				}
				fps = append(fps, k.Fingerprint)
			}
			if !slices.Equal(fps, tt.keys) {
				t.Fatalf("keys %v, want %v", fps, tt.keys)
			}
		})
	}
}

func TestLocalKeyringWithoutKeyring(t *testing.T) {
	s := New(&fakeProposer{}, slog.New(slog.DiscardHandler)).WithKeyring("c1", nil)
	got, err := s.LocalKeyring(context.Background(), &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST})
	if err != nil || !strings.Contains(got.GetError(), "--gossip-key-file") {
		t.Fatalf("LocalKeyring = %v, %v; want an answer naming --gossip-key-file", got, err)
	}
}
