package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// statusAdmin answers ModelStatus with st for its model, NOT_FOUND for
// another.
type statusAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	st *llmgwv1.ModelStatusResponse
}

func (s *statusAdmin) ModelStatus(_ context.Context, req *llmgwv1.ModelStatusRequest) (*llmgwv1.ModelStatusResponse, error) {
	if req.GetName() != s.st.GetModel().GetName() {
		return nil, status.Errorf(codes.NotFound, "model %q: not found", req.GetName())
	}
	return s.st, nil
}

// TestModelStatusCommand: the counts, the reason for missing replicas,
// the demand and the decisions newest first with HELD for a step not
// taken; a fixed model says it has no autoscale; an unknown one fails.
func TestModelStatusCommand(t *testing.T) {
	at := time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC)
	s := &statusAdmin{st: &llmgwv1.ModelStatusResponse{
		Model:   &llmgwv1.Model{Name: "chat", Replicas: 1, Autoscale: &llmgwv1.Autoscale{Min: 0, Max: 10, TargetWaiting: 2}},
		Desired: 6, Placed: 5, Ready: 4, Sleeping: 1,
		UnplacedReason: "1 of 6 replicas cannot be placed: each needs 1 GPU; dev has 8, 0 free",
		Scale:          &llmgwv1.ModelScale{Model: "chat", Replicas: 6, Reason: "up: waiting 20.0", DecidedUnixMs: at.UnixMilli()},
		Demand:         &llmgwv1.ModelDemand{Model: "chat", Held: 3, Waiting: 40, Running: 64, Replicas: 4, Requests: 900},
		Events: []*llmgwv1.ScaleEvent{
			{UnixMs: at.Add(time.Minute).UnixMilli(), From: 6, To: 10, Reason: "waiting for 2 starting replicas", Blocked: true},
			{UnixMs: at.UnixMilli(), From: 2, To: 6, Reason: "up: waiting 20.0"},
		},
	}}
	addr := serveAdmin(t, s)
	out, err := run(addr, "model", "status", "chat")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{
		"model chat: 6 desired, 5 placed, 4 ready, 1 asleep",
		"not placed: 1 of 6 replicas cannot be placed",
		"autoscale: 0..10, set to 6 at 2026-12-03T05:00:00Z: up: waiting 20.0",
		"demand: 3 held, 40.0 waiting, 64.0 running on 4 replicas, 900 requests in the last minute",
		"05:01:00  HELD  6     10  waiting for 2 starting replicas",
		"05:00:00  STEP  2     6   up: waiting 20.0",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Index(out, "HELD") > strings.Index(out, "STEP") {
		t.Errorf("decisions not newest first:\n%s", out)
	}
	s.st = &llmgwv1.ModelStatusResponse{Model: &llmgwv1.Model{Name: "fixed", Replicas: 2}, Desired: 2, Placed: 2, Ready: 2}
	if out, err := run(addr, "model", "status", "fixed"); err != nil || !strings.Contains(out, "replicas: 2 (no autoscale)") {
		t.Fatalf("a fixed model: %v\n%s", err, out)
	}
	if _, err := run(addr, "model", "status", "nope"); err == nil || !strings.Contains(err.Error(), "model status:") {
		t.Fatalf("unknown model: %v", err)
	}
}
