package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// namesAdmin lists two models (one with adapters) and two nodes.
type namesAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
}

func (namesAdmin) ListModels(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListModelsResponse, error) {
	return &llmgwv1.ListModelsResponse{Models: []*llmgwv1.Model{
		{Name: "demo"}, {Name: "llama-8b", Adapters: []*llmgwv1.Adapter{{Name: "sql-lora"}, {Name: "support-lora"}}},
	}}, nil
}

func (namesAdmin) ListNodes(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListNodesResponse, error) {
	return &llmgwv1.ListNodesResponse{Nodes: []*llmgwv1.Node{{Id: "gpu1"}, {Id: "gpu2"}}}, nil
}

// complete runs cobra's hidden __complete as a shell's completion script
// does and returns the candidates and the directive line.
func complete(t *testing.T, args ...string) (names []string, directive string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := execute(append([]string{"__complete"}, args...), &stdout, &stderr); code != exitOK {
		t.Fatalf("__complete %q: exit status %d: %s", args, code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

// TestCompletionNames: Tab completes model, node and adapter names from
// the control plane (issue 34).
func TestCompletionNames(t *testing.T) {
	addr := serveAdmin(t, namesAdmin{})
	tests := []struct {
		args      []string
		want      []string
		directive string
	}{
		{[]string{"model", "delete", ""}, []string{"demo", "llama-8b"}, ":4"},
		{[]string{"model", "status", "ll"}, []string{"llama-8b"}, ":4"},
		{[]string{"node", "drain", ""}, []string{"gpu1", "gpu2"}, ":4"},
		{[]string{"node", "undrain", "gpu2"}, []string{"gpu2"}, ":4"},
		{[]string{"node", "label", "g"}, []string{"gpu1", "gpu2"}, ":4"},
		{[]string{"node", "label", "gpu1", ""}, nil, ":4"}, // labels, not names
		{[]string{"bench", "--model", "s"}, []string{"sql-lora", "support-lora"}, ":4"},
		{[]string{"usage", "--model", ""}, []string{"demo", "llama-8b"}, ":4"},
		{[]string{"apikey", "create", "me", "--models", "demo,sq"}, []string{"demo,sql-lora"}, ":6"}, // no space after a list's element
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, directive := complete(t, append([]string{"--addr", addr}, tt.args...)...)
			if strings.Join(got, " ") != strings.Join(tt.want, " ") || directive != tt.directive {
				t.Errorf("completed %q %s, want %q %s", got, directive, tt.want, tt.directive)
			}
		})
	}
}

// TestCompletionServerSilent: a server that accepts and never answers
// costs completionTimeout, not --timeout, and completes nothing (no file
// names either).
func TestCompletionServerSilent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() { <-done; conn.Close() }()
		}
	}()
	// --timeout 1h: only completionTimeout can end the call.
	got, directive := complete(t, "--addr", l.Addr().String(), "--timeout", "1h", "model", "delete", "")
	if len(got) != 0 || directive != ":4" {
		t.Errorf("completed %q %s, want nothing and :4 (no files)", got, directive)
	}
}
