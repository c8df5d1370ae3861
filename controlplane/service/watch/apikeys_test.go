//go:build !llmgw_upgrade_old

package watch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// recordingStream hands every event sent to the test.
type recordingStream struct {
	grpc.ServerStream
	ctx    context.Context
	events chan *llmgwv1.WatchEvent
}

func (s *recordingStream) Context() context.Context { return s.ctx }

func (s *recordingStream) Send(e *llmgwv1.WatchEvent) error {
	select {
	case s.events <- proto.Clone(e).(*llmgwv1.WatchEvent):
	case <-s.ctx.Done():
	}
	return nil
}

func apply(t *testing.T, f *fsm.FSM, index uint64, typ llmgwv1.CommandType, p proto.Message) {
	t.Helper()
	b, err := fsm.NewCommand(typ, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(index, b); err != nil {
		t.Fatal(err)
	}
}

// TestWatchCarriesAPIKeys: a watcher from revision 0 gets the keys, with
// their hashes (routers check them), inside the framed snapshot; a revoke
// afterwards reaches it as a DELETE of the key's name.
func TestWatchCarriesAPIKeys(t *testing.T) {
	f := fsm.New(fsm.Config{})
	h := sha256.Sum256([]byte("secret"))
	apply(t, f, 1, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: &llmgwv1.ApiKey{Name: "team-a", SecretSha256: h[:], Models: []string{"demo"}}})
	w := New(Config{HeartbeatInterval: time.Hour, WatchWait: time.Second, WatchQueue: 8},
		f, ephemeral.NewStore(), onePeer{}, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := &recordingStream{ctx: ctx, events: make(chan *llmgwv1.WatchEvent, 64)}
	done := make(chan error, 1)
	go func() { done <- w.Watch(&llmgwv1.WatchRequest{ClientId: "r1"}, stream) }()
	defer func() {
		cancel()
		<-done
	}()

	next := func(what string, ok func(*llmgwv1.WatchEvent) bool) *llmgwv1.WatchEvent {
		t.Helper()
		for {
			select {
			case e := <-stream.events:
				if ok(e) {
					return e
				}
			case <-ctx.Done():
				t.Fatalf("no %s on the stream", what)
			}
		}
	}
	var inSnapshot bool
	put := next("api key in the snapshot", func(e *llmgwv1.WatchEvent) bool {
		if e.GetSnapshotBegin() != nil {
			inSnapshot = true
		}
		if e.GetSnapshotEnd() != nil {
			t.Fatal("snapshot ended without the api key")
		}
		return inSnapshot && e.GetChange().GetApiKey() != nil
	}).GetChange()
	if put.Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || put.GetApiKey().GetName() != "team-a" || !bytes.Equal(put.GetApiKey().GetSecretSha256(), h[:]) {
		t.Fatalf("snapshot change = %v", put)
	}
	next("end of the snapshot", func(e *llmgwv1.WatchEvent) bool { return e.GetSnapshotEnd() != nil })

	apply(t, f, 2, llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY, &llmgwv1.DeleteApiKeyCommand{Name: "team-a"})
	del := next("revoke", func(e *llmgwv1.WatchEvent) bool { return e.GetChange().GetApiKey() != nil }).GetChange()
	if del.Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE || del.Revision != 2 || del.GetApiKey().GetName() != "team-a" {
		t.Fatalf("revoke change = %v", del)
	}
	next("mark after the revoke", func(e *llmgwv1.WatchEvent) bool { return e.GetMark().GetRevision() == 2 })
}
