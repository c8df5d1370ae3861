package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// flowAdmin answers FlowStatus with st, or err.
type flowAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	st  *llmgwv1.FlowStatusResponse
	err error
}

func (f *flowAdmin) FlowStatus(context.Context, *llmgwv1.FlowStatusRequest) (*llmgwv1.FlowStatusResponse, error) {
	return f.st, f.err
}

var reportedAt = time.UnixMilli(1_700_000_000_000)

func flowStatus() *llmgwv1.FlowStatusResponse {
	return &llmgwv1.FlowStatusResponse{
		Routers: []*llmgwv1.FlowRouterDepths{
			{Router: "r1", ReportedUnixMs: reportedAt.UnixMilli(), Depths: []*llmgwv1.FlowDepth{
				{Model: "demo", Class: "interactive", Queued: 3, QueuedBytes: 300, OldestWaitMs: 1500},
				{Model: "demo", Class: "batch", Rank: 2, Queued: 40, QueuedBytes: 4000, OldestWaitMs: 12_000},
			}},
			{Router: "r2", ReportedUnixMs: reportedAt.Add(-200 * time.Millisecond).UnixMilli()},
		},
		Total: []*llmgwv1.FlowDepth{
			{Model: "demo", Class: "interactive", Queued: 3, QueuedBytes: 300, OldestWaitMs: 1500, Routers: 1},
			{Model: "demo", Class: "batch", Rank: 2, Queued: 40, QueuedBytes: 4000, OldestWaitMs: 12_000, Routers: 1},
		},
	}
}

// TestFlowCommand: `flow` prints the queues summed per model and class,
// highest class first; --routers each router's, one with no queue on a
// line of its own; -o json the whole status with numbers as numbers; an
// idle fleet says so; a cluster without a leader exits "unavailable".
func TestFlowCommand(t *testing.T) {
	f := &flowAdmin{st: flowStatus()}
	addr := serveAdmin(t, f)
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"flow"}, []string{
			"MODEL  CLASS        QUEUED  OLDEST  ROUTERS",
			"demo   interactive  3       1.5s    1",
			"demo   batch        40      12s     1",
		}},
		{[]string{"flow", "--routers"}, []string{"ROUTER  MODEL  CLASS", "r1      demo   interactive  3       1.5s", "r2      -      -            0       -", " ago"}},
		{[]string{"flow", "-o", "json"}, []string{`"router": "r2"`, `"oldest_wait_ms": 12000`, `"queued": 40`, `"total": [`}},
	} {
		out, err := run(addr, tt.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tt.args, err, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v lacks %q:\n%s", tt.args, w, out)
			}
		}
	}
	if out, _ := run(addr, "flow"); strings.Index(out, "interactive") > strings.Index(out, "batch") {
		t.Errorf("the lower class is listed first:\n%s", out)
	}

	f.st = &llmgwv1.FlowStatusResponse{Routers: []*llmgwv1.FlowRouterDepths{{Router: "r1"}}}
	if out, err := run(addr, "flow"); err != nil || !strings.Contains(out, "no request queued (1 routers reporting)") {
		t.Fatalf("an idle fleet: %v\n%s", err, out)
	}
	f.st = &llmgwv1.FlowStatusResponse{}
	if out, err := run(addr, "flow", "--routers"); err != nil || !strings.Contains(out, "no router reporting") {
		t.Fatalf("no router: %v\n%s", err, out)
	}

	f.st, f.err = nil, status.Error(codes.Unavailable, "no leader: c1 found no leader in the 7s it held this call")
	if _, err := run(addr, "flow"); err == nil || !strings.Contains(err.Error(), "flow status:") || exitCode(err) != exitUnavailable {
		t.Fatalf("without a leader: %v (exit %d), want unavailable", err, exitCode(err))
	}
}

// TestPrintFlowRouters: REPORTED is how long before now each router's
// report came.
func TestPrintFlowRouters(t *testing.T) {
	var out bytes.Buffer
	c := &cli{out: &out}
	if err := c.printFlowRouters(flowStatus(), reportedAt.Add(250*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	want := "ROUTER  MODEL  CLASS        QUEUED  OLDEST  REPORTED\n" +
		"r1      demo   interactive  3       1.5s    250ms ago\n" +
		"r1      demo   batch        40      12s     250ms ago\n" +
		"r2      -      -            0       -       450ms ago\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}
