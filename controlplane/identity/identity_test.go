package identity

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	idA = "0123456789abcdef0123456789abcdef"
	idB = "fedcba9876543210fedcba9876543210"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		name    string
		file    string // "" for no file
		want    string
		wantErr string
	}{
		{"no file: no identity yet", "", "", ""},
		{"a valid id", idA + "\n", idA, ""},
		{"garbage is refused, naming the file", "not-an-id\n", "", "cluster-id holds \"not-an-id\""},
		{"upper case is refused", strings.ToUpper(idA), "", "not a cluster id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.file != "" {
				if err := os.WriteFile(filepath.Join(dir, FileName), []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			i, err := Open(dir, slog.New(slog.DiscardHandler))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := i.ID(); got != tt.want {
				t.Fatalf("ID() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAdopt(t *testing.T) {
	dir := t.TempDir()
	i, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	i.OnAdopt(func(id string) { got = append(got, id) })
	if err := i.Adopt("bad"); err == nil {
		t.Fatal("a malformed id was adopted")
	}
	if err := i.Adopt(idA); err != nil {
		t.Fatal(err)
	}
	if err := i.Adopt(idA); err != nil {
		t.Fatalf("adopting the same id again: %v", err)
	}
	if err := i.Adopt(idB); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("adopting another id: got %v, want ErrOtherCluster", err)
	}
	if i.ID() != idA || len(got) != 1 || got[0] != idA {
		t.Fatalf("ID %q, callbacks %v; want %s once", i.ID(), got, idA)
	}
	// The file survives a restart, and a callback registered then runs at once.
	again, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var late string
	again.OnAdopt(func(id string) { late = id })
	if again.ID() != idA || late != idA {
		t.Fatalf("after reopening: ID %q, callback %q; want %s", again.ID(), late, idA)
	}
	if err := again.Adopt(idB); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("after reopening, another id: got %v, want ErrOtherCluster", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("data dir holds %d entries, want the id file alone (no temporary left)", len(entries))
	}
}

func TestAdoptUnwritableDir(t *testing.T) {
	i, err := Open(filepath.Join(t.TempDir(), "missing"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := i.Adopt(idA); err == nil {
		t.Fatal("adopted with no data dir to keep the id in")
	}
	if i.ID() != "" {
		t.Fatalf("ID %q after a failed adopt, want none", i.ID())
	}
}

func TestMint(t *testing.T) {
	a, err := Mint(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Mint(nil)
	if len(a) != 32 || a == b {
		t.Fatalf("Mint gave %q and %q: want two distinct 32-digit ids", a, b)
	}
	seeded, _ := Mint(bytes.NewReader(bytes.Repeat([]byte{0xab}, 16)))
	if seeded != strings.Repeat("ab", 16) {
		t.Fatalf("Mint from a fixed reader = %q", seeded)
	}
	if _, err := Mint(bytes.NewReader(nil)); err == nil {
		t.Fatal("Mint with no randomness succeeded")
	}
}

// fakeState is the FSM as Run and EnsureMinted see it.
type fakeState struct {
	mu   sync.Mutex
	cfg  *llmgwv1.ClusterConfig
	next chan struct{}
}

func newFakeState(id string) *fakeState {
	return &fakeState{cfg: &llmgwv1.ClusterConfig{ClusterId: id, DefaultBlockSize: 16}, next: make(chan struct{})}
}

func (f *fakeState) Config() *llmgwv1.ClusterConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return proto.Clone(f.cfg).(*llmgwv1.ClusterConfig)
}

func (f *fakeState) Applied() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 0, f.next
}

func (f *fakeState) set(id string) {
	f.mu.Lock()
	f.cfg.ClusterId = id
	close(f.next)
	f.next = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeState) Propose(_ context.Context, t llmgwv1.CommandType, p proto.Message) (any, uint64, error) {
	if t != llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG {
		return nil, 0, errors.New("unexpected command")
	}
	f.mu.Lock()
	f.cfg = proto.Clone(p.(*llmgwv1.SetClusterConfigCommand).GetConfig()).(*llmgwv1.ClusterConfig)
	f.mu.Unlock()
	return nil, 1, nil
}

func TestRunAdoptsAndStopsOnConflict(t *testing.T) {
	i, _ := Open(t.TempDir(), slog.New(slog.DiscardHandler))
	st := newFakeState("")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- i.Run(ctx, st) }()
	st.set(idA)
	testkit.Wait(t, "the replicated id adopted", func() bool { return i.ID() == idA })
	st.set(idB)
	select {
	case err := <-done:
		if !errors.Is(err, ErrOtherCluster) {
			t.Fatalf("Run returned %v, want ErrOtherCluster", err)
		}
	case <-time.After(testkit.DefaultTimeout):
		t.Fatal("Run did not stop on a replicated id that differs from the adopted one")
	}
	if i.ID() != idA {
		t.Fatalf("ID changed to %q", i.ID())
	}
}

func TestEnsureMinted(t *testing.T) {
	tests := []struct {
		name       string
		replicated string
		local      string
		want       string
	}{
		{"new cluster: minted", "", "", strings.Repeat("cd", 16)},
		{"already set: kept", idA, "", idA},
		{"state lacks the data dir's id: the data dir's", "", idB, idB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.local != "" {
				os.WriteFile(filepath.Join(dir, FileName), []byte(tt.local), 0o600)
			}
			local, err := Open(dir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			st := newFakeState(tt.replicated)
			if err := EnsureMinted(context.Background(), st, st, local, bytes.NewReader(bytes.Repeat([]byte{0xcd}, 16))); err != nil {
				t.Fatal(err)
			}
			got := st.Config()
			if got.GetClusterId() != tt.want || got.GetDefaultBlockSize() != 16 {
				t.Fatalf("config after EnsureMinted: %v, want cluster id %s and the rest kept", got, tt.want)
			}
		})
	}
}
