package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// stateAdmin answers the list, delete and drain calls with the error it is
// given (nil: an empty answer), after delay, and records whether each list
// asked for a consistent read.
type stateAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	err   error
	delay time.Duration

	mu         sync.Mutex
	consistent map[string]bool
}

func (s *stateAdmin) answer(ctx context.Context, call string, req *llmgwv1.ListRequest) error {
	if req != nil {
		s.mu.Lock()
		s.consistent[call] = req.Consistent
		s.mu.Unlock()
	}
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	return s.err
}

func (s *stateAdmin) ListModels(ctx context.Context, r *llmgwv1.ListRequest) (*llmgwv1.ListModelsResponse, error) {
	return &llmgwv1.ListModelsResponse{}, s.answer(ctx, "model", r)
}

func (s *stateAdmin) ListNodes(ctx context.Context, r *llmgwv1.ListRequest) (*llmgwv1.ListNodesResponse, error) {
	return &llmgwv1.ListNodesResponse{}, s.answer(ctx, "node", r)
}

func (s *stateAdmin) ListReplicas(ctx context.Context, r *llmgwv1.ListRequest) (*llmgwv1.ListReplicasResponse, error) {
	return &llmgwv1.ListReplicasResponse{}, s.answer(ctx, "replica", r)
}

func (s *stateAdmin) ListApiKeys(ctx context.Context, r *llmgwv1.ListRequest) (*llmgwv1.ListApiKeysResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	return &llmgwv1.ListApiKeysResponse{}, s.answer(ctx, "apikey", r)
}

func (s *stateAdmin) DeleteModel(ctx context.Context, _ *llmgwv1.DeleteModelRequest) (*llmgwv1.DeleteModelResponse, error) {
	return &llmgwv1.DeleteModelResponse{}, s.answer(ctx, "delete", nil)
}

func (s *stateAdmin) DrainNode(ctx context.Context, _ *llmgwv1.DrainNodeRequest) (*llmgwv1.DrainNodeResponse, error) {
	return &llmgwv1.DrainNodeResponse{}, s.answer(ctx, "drain", nil)
}

func serveState(t *testing.T, s *stateAdmin) string {
	t.Helper()
	s.consistent = map[string]bool{}
	return serveAdmin(t, s)
}

// TestExitStatus: each outcome has its exit status and a message an
// operator can act on, on stderr, with nothing on stdout.
func TestExitStatus(t *testing.T) {
	noLeader := "no leader: c3 found no leader in the 5s it held this call; it reaches 1 of 3 voters (c1, c2 not alive in gossip) and a quorum needs 2"
	tests := []struct {
		name  string
		args  []string
		err   error
		delay time.Duration
		addr  string // "" the fake's
		want  int
		// wantMsg are the pieces stderr must hold.
		wantMsg []string
	}{
		{name: "ok", args: []string{"model", "list"}, want: exitOK},
		{name: "model not found", args: []string{"model", "delete", "nope"}, err: status.Error(codes.NotFound, `model "nope" not found`),
			want: exitNotFound, wantMsg: []string{`llmgwctl: model delete: model "nope" not found` + "\n"}},
		{name: "node not found", args: []string{"node", "drain", "nope"}, err: status.Error(codes.NotFound, `node "nope" not found`),
			want: exitNotFound, wantMsg: []string{`llmgwctl: node drain: node "nope" not found` + "\n"}},
		{name: "no leader", args: []string{"model", "delete", "m"}, err: status.Error(codes.Unavailable, noLeader),
			want: exitUnavailable, wantMsg: []string{"llmgwctl: model delete: " + noLeader + "\n"}},
		{name: "no leader on a consistent read", args: []string{"replica", "list", "--consistent"}, err: status.Error(codes.Unavailable, noLeader),
			want: exitUnavailable, wantMsg: []string{"llmgwctl: replica list: " + noLeader}},
		{name: "no server at the address", args: []string{"model", "list"}, addr: "127.0.0.1:1",
			want: exitUnavailable, wantMsg: []string{"no server answers at 127.0.0.1:1 (give --addr or LLMGW_ADDR)", "connection refused"}},
		{name: "the server cannot reach the leader", args: []string{"model", "delete", "m"},
			err:  status.Error(codes.Unavailable, `c3 cannot reach the leader c1 at 10.0.0.1:7400: connection error: desc = "transport: Error while dialing: connection refused"`),
			want: exitUnavailable, wantMsg: []string{"llmgwctl: model delete: c3 cannot reach the leader c1 at 10.0.0.1:7400: connection error"}},
		{name: "leadership lost mid-write", args: []string{"model", "delete", "m"}, err: status.Error(codes.Aborted, "leadership lost while committing; the write may or may not have been applied"),
			want: exitUnknown, wantMsg: []string{"may or may not have been applied"}},
		{name: "the leader did not answer in time", args: []string{"node", "drain", "n1"},
			err:  status.Error(codes.DeadlineExceeded, "the leader c1 at 10.0.0.1:7400 did not answer c3 in time"),
			want: exitUnknown, wantMsg: []string{"the leader c1 at 10.0.0.1:7400 did not answer c3 in time"}},
		{name: "--timeout passed", args: []string{"model", "delete", "m", "--timeout", "200ms"}, delay: time.Minute,
			want: exitUnknown, wantMsg: []string{"llmgwctl: model delete: ", "did not answer within --timeout 200ms; a write may or may not have been applied"}},
		{name: "refused", args: []string{"model", "delete", "m"}, err: status.Error(codes.FailedPrecondition, "the cluster's minimum version refuses it"),
			want: exitError, wantMsg: []string{"llmgwctl: model delete: the cluster's minimum version refuses it\n"}},
		{name: "unknown command", args: []string{"modle", "list"}, want: exitUsage,
			wantMsg: []string{`unknown command "modle" for "llmgwctl"`, "see 'llmgwctl --help'"}},
		{name: "unknown subcommand", args: []string{"model", "lis"}, want: exitUsage,
			wantMsg: []string{`unknown command "lis" for "llmgwctl model" (did you mean list?)`, "see 'llmgwctl model --help'"}},
		{name: "unknown flag", args: []string{"node", "list", "--consistant"}, want: exitUsage, wantMsg: []string{"unknown flag: --consistant"}},
		{name: "missing argument", args: []string{"model", "delete"}, want: exitUsage, wantMsg: []string{"accepts 1 arg(s), received 0", "see 'llmgwctl model delete --help'"}},
		{name: "bad output format", args: []string{"model", "list", "-o", "yaml"}, want: exitUsage, wantMsg: []string{`-o: "yaml" is neither table nor json`}},
		{name: "apply without a file", args: []string{"model", "apply"}, want: exitUsage, wantMsg: []string{"-f: a model file is required"}},
		{name: "apply of a file not there", args: []string{"model", "apply", "-f", "/nonexistent/m.yaml"}, want: exitError, wantMsg: []string{"-f: open /nonexistent/m.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr
			if addr == "" {
				addr = serveState(t, &stateAdmin{err: tt.err, delay: tt.delay})
			}
			var stdout, stderr bytes.Buffer
			code := execute(append([]string{"--addr", addr}, tt.args...), &stdout, &stderr)
			if code != tt.want {
				t.Errorf("exit status %d, want %d; stderr %q", code, tt.want, stderr.String())
			}
			for _, w := range tt.wantMsg {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q lacks %q", stderr.String(), w)
				}
			}
			if tt.want != exitOK && stdout.Len() > 0 {
				t.Errorf("stdout %q on a failure", stdout.String())
			}
			if tt.want == exitOK && stderr.Len() > 0 {
				t.Errorf("stderr %q on success", stderr.String())
			}
		})
	}
}

// TestSuggestions: a command one or two edits from a real one, not only a
// prefix of it, is a usage error that names the real one.
func TestSuggestions(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{args: []string{"mode"}, want: `unknown command "mode" for "llmgwctl" (did you mean model?)`},
		{args: []string{"modl"}, want: `unknown command "modl" for "llmgwctl" (did you mean model?)`},
		{args: []string{"models"}, want: `unknown command "models" for "llmgwctl" (did you mean model?)`},
		{args: []string{"modle", "list"}, want: `unknown command "modle" for "llmgwctl" (did you mean model?)`},
		{args: []string{"clustr"}, want: `unknown command "clustr" for "llmgwctl" (did you mean cluster?)`},
		{args: []string{"nodes", "list"}, want: `unknown command "nodes" for "llmgwctl" (did you mean node?)`},
		{args: []string{"model", "lst"}, want: `unknown command "lst" for "llmgwctl model" (did you mean list?)`},
		{args: []string{"replica", "lis"}, want: `unknown command "lis" for "llmgwctl replica" (did you mean list?)`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := execute(tt.args, &stdout, &stderr); code != exitUsage {
				t.Errorf("exit status %d, want %d", code, exitUsage)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.want)
			}
		})
	}
}

// TestHelpSaysTheExitStatuses: `llmgwctl --help` documents every status.
func TestHelpSaysTheExitStatuses(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := execute([]string{"--help"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit status %d: %s", code, stderr.String())
	}
	for _, w := range []string{"Exit status:", "2  usage", "3  not found", "4  unavailable", "5  outcome unknown", "--consistent"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("help lacks %q:\n%s", w, stdout.String())
		}
	}
}

// TestConsistentFlag: every list command sends consistent with
// --consistent, and only then.
func TestConsistentFlag(t *testing.T) {
	for _, list := range []string{"model", "node", "replica", "apikey"} {
		for _, consistent := range []bool{false, true} {
			s := &stateAdmin{}
			addr := serveState(t, s)
			args := []string{"--addr", addr, list, "list"}
			if consistent {
				args = append(args, "--consistent")
			}
			var stdout, stderr bytes.Buffer
			if code := execute(args, &stdout, &stderr); code != exitOK {
				t.Fatalf("%v: exit status %d: %s", args, code, stderr.String())
			}
			s.mu.Lock()
			got, asked := s.consistent[list]
			s.mu.Unlock()
			if !asked || got != consistent {
				t.Errorf("%s list (--consistent %t): asked %t, consistent %t", list, consistent, asked, got)
			}
		}
	}
}
