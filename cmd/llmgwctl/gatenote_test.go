package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// gateAdmin answers ClusterStatus with its minimum version and accepts
// the gated writes.
type gateAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	minVersion string
}

func (g *gateAdmin) ClusterStatus(context.Context, *llmgwv1.ClusterStatusRequest) (*llmgwv1.ClusterStatusResponse, error) {
	return &llmgwv1.ClusterStatusResponse{MinVersion: g.minVersion}, nil
}

func (g *gateAdmin) SetNodeLabels(context.Context, *llmgwv1.SetNodeLabelsRequest) (*llmgwv1.SetNodeLabelsResponse, error) {
	return &llmgwv1.SetNodeLabelsResponse{Revision: 5}, nil
}

func (g *gateAdmin) CreateApiKey(context.Context, *llmgwv1.CreateApiKeyRequest) (*llmgwv1.CreateApiKeyResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	return &llmgwv1.CreateApiKeyResponse{Revision: 6}, nil
}

// TestGateNote: a write that opens the minimum-version gate says so on
// stderr — no downgrade from then on — and only that one (issue 34).
func TestGateNote(t *testing.T) {
	tests := []struct {
		name       string
		minVersion string
		args       []string
		wantNote   bool
	}{
		{"node label, first gated write", "", []string{"node", "label", "n1", "zone=b"}, true},
		{"apikey create, first gated write", "", []string{"apikey", "create", "me"}, true},
		{"apikey create as JSON: the note stays off stdout", "", []string{"apikey", "create", "me", "-o", "json"}, true},
		{"the gate already open", "v0.2.0", []string{"apikey", "create", "me"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := serveAdmin(t, &gateAdmin{minVersion: tt.minVersion})
			var stdout, stderr bytes.Buffer
			if code := execute(append([]string{"--addr", addr}, tt.args...), &stdout, &stderr); code != exitOK {
				t.Fatalf("exit status %d: %s", code, stderr.String())
			}
			note := stderr.String()
			if got := strings.Contains(note, "a downgrade below v0.2.0 is no longer possible"); got != tt.wantNote {
				t.Errorf("note %t, want %t: stderr %q", got, tt.wantNote, note)
			}
			if tt.wantNote && !strings.Contains(note, "minimum version to v0.2.0") {
				t.Errorf("stderr %q does not name the new minimum version", note)
			}
			if strings.Contains(stdout.String(), "note:") {
				t.Errorf("the note is on stdout: %q", stdout.String())
			}
		})
	}
}
