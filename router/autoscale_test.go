package router

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/internal/ttftbuckets"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// liveControl is a control server whose watch stream sends an opening
// and then whatever the test pushes, and whose FlowService keeps every
// report.
type liveControl struct {
	llmgwv1.UnimplementedWatchServiceServer
	llmgwv1.UnimplementedFlowServiceServer
	opening []*llmgwv1.WatchEvent
	more    chan *llmgwv1.WatchEvent

	mu      sync.Mutex
	reports []*llmgwv1.FlowReport
}

func (c *liveControl) Watch(_ *llmgwv1.WatchRequest, st grpc.ServerStreamingServer[llmgwv1.WatchEvent]) error {
	for _, ev := range c.opening {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-st.Context().Done():
			return nil
		case ev := <-c.more:
			if err := st.Send(ev); err != nil {
				return err
			}
		}
	}
}

func (c *liveControl) Report(_ context.Context, r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reports = append(c.reports, r)
	return &llmgwv1.FlowView{ValidMs: 3000}, nil
}

// last is the newest report's demand of model; nil before any.
func (c *liveControl) last(model string) *llmgwv1.ModelDemand {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.reports) - 1; i >= 0; i-- {
		for _, d := range c.reports[i].GetDemand() {
			if d.GetModel() == model {
				return d
			}
		}
	}
	return nil
}

func (c *liveControl) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	llmgwv1.RegisterWatchServiceServer(srv, c)
	llmgwv1.RegisterFlowServiceServer(srv, c)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return ln.Addr().String()
}

func put(rev uint64, c *llmgwv1.Change) *llmgwv1.WatchEvent {
	c.Revision, c.Op = rev, llmgwv1.ChangeOp_CHANGE_OP_PUT
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}}
}

// TestFromZero runs a router, flow control off, over an autoscaled model
// with no replica: a request is held and the router's flow reports say
// so; once the control plane places a replica and its agent reports it
// READY, the request is answered by it, and the reports count it as sent
// with its time to first token.
func TestFromZero(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	defer eng.Close()
	model := &llmgwv1.Model{Name: "auto", Engine: "sim", Autoscale: &llmgwv1.Autoscale{Max: 2, TargetWaiting: 2},
		ExtraArgs: []string{"--max-num-seqs", "4"}}
	ctl := &liveControl{more: make(chan *llmgwv1.WatchEvent, 4), opening: []*llmgwv1.WatchEvent{
		{Event: &llmgwv1.WatchEvent_SnapshotBegin{SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: 7}}},
		put(7, &llmgwv1.Change{Object: &llmgwv1.Change_Model{Model: model}}),
		{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: 7}}},
	}}

	cfg := DefaultConfig()
	cfg.ID = "r-zero"
	cfg.Control = []string{ctl.serve(t)}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.OpsAddr = ""
	cfg.ScrapeInterval = 20 * time.Millisecond
	cfg.Flow.Enabled = false
	cfg.Flow.ReportInterval = 20 * time.Millisecond
	r, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitStatus(t, base+"/readyz", 200)
	testkit.Wait(t, "a report of the autoscaled model, idle", func() bool {
		d := ctl.last("auto")
		return d != nil && d.Held == 0 && d.Replicas == 0
	})

	type answer struct {
		code int
		held string
		body string
		err  error
	}
	got := make(chan answer, 1)
	sent := time.Now()
	go func() {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"auto","stream":true,"messages":[]}`))
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- answer{code: resp.StatusCode, held: resp.Header.Get("X-Llmgw-Hold-Ms"), body: string(b), err: err}
	}()
	testkit.Wait(t, "a report of the request held", func() bool {
		d := ctl.last("auto")
		return d != nil && d.Held == 1
	})
	heldFor := time.Since(sent)

	// The control plane places a replica; its agent reports it ready.
	placed := time.Now()
	ctl.more <- put(8, &llmgwv1.Change{Object: &llmgwv1.Change_Replica{Replica: &llmgwv1.Replica{Id: "auto-0", Uid: 5, Model: "auto", Node: "n1"}}})
	ctl.more <- &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true,
		Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "auto-0", Uid: 5, Incarnation: 1,
			Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: strings.TrimPrefix(eng.URL, "http://")}}}}}
	var a answer
	select {
	case a = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not answered within 10 s of its replica becoming ready")
	}
	answered := time.Since(placed)
	if a.err != nil || a.code != 200 || a.held == "" || !strings.Contains(a.body, "[DONE]") {
		t.Fatalf("held request: %d held %q ms: %q (%v)", a.code, a.held, a.body, a.err)
	}
	testkit.Wait(t, "a report counting the request sent, with its time to first token, nothing held", func() bool {
		d := ctl.last("auto")
		var n uint64
		for _, c := range d.GetTtftBuckets() {
			n += c
		}
		return d.GetHeld() == 0 && d.GetRequests() == 1 && n == 1 && d.GetReplicas() == 1
	})
	d := ctl.last("auto")
	t.Logf("held %s ms (first report saying held after %s); answered %s after the replica was placed; reported TTFT p90 %s",
		a.held, heldFor.Round(time.Millisecond), answered.Round(time.Millisecond), ttftbuckets.P90(d.GetTtftBuckets()))
}
