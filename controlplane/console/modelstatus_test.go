package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

const (
	ready      = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	starting   = llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
	restarting = llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING
	sleeping   = llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING
)

// rv is a replica of model "chat" with uid i+1 and its agent's report;
// phase 0 means no report yet.
func rv(i int, phase llmgwv1.ReplicaPhase, msg string) *llmgwv1.ReplicaView {
	v := &llmgwv1.ReplicaView{Replica: &llmgwv1.Replica{Id: fmt.Sprintf("chat-%d", i), Uid: uint64(i + 1), Model: "chat", Node: "n1"}}
	if phase != 0 {
		v.Status = &llmgwv1.ReplicaStatus{ReplicaId: v.Replica.Id, Uid: v.Replica.Uid, Phase: phase, Message: msg}
	}
	return v
}

func asleep(v *llmgwv1.ReplicaView) *llmgwv1.ReplicaView   { v.Replica.Sleeping = true; return v }
func draining(v *llmgwv1.ReplicaView) *llmgwv1.ReplicaView { v.Replica.Draining = true; return v }

// TestSummarize: the state and the reason the models page shows for each
// way a model can fall short of its count, and none when it does not.
func TestSummarize(t *testing.T) {
	fixed := &llmgwv1.Model{Name: "chat", Engine: "vllm", Replicas: 2}
	scaled := &llmgwv1.Model{Name: "chat", Engine: "vllm", Replicas: 1, Autoscale: &llmgwv1.Autoscale{Min: 0, Max: 10, TargetWaiting: 2}}
	external := &llmgwv1.Model{Name: "chat", Engine: "external", Replicas: 1, Endpoints: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}}
	status := func(desired, placed, ready, sleeping uint32, reason string) *llmgwv1.ModelStatusResponse {
		return &llmgwv1.ModelStatusResponse{Desired: desired, Placed: placed, Ready: ready, Sleeping: sleeping, UnplacedReason: reason}
	}
	noLeader := errors.New("rpc error: code = Unavailable desc = no leader")
	for _, tc := range []struct {
		name  string
		m     *llmgwv1.Model
		st    *llmgwv1.ModelStatusResponse
		err   error
		views []*llmgwv1.ReplicaView
		state string
		why   []string // each in Why; none means Why is empty
		want  [4]uint32
	}{
		{name: "every replica ready", m: fixed, st: status(2, 2, 2, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, ready, "")},
			state: StateReady, want: [4]uint32{2, 2, 2, 0}},
		{name: "the leader's reason for the unplaced", m: scaled, st: status(10, 6, 6, 0, "4 of 10 replicas cannot be placed: each needs 1 GPU; n1 has 8, 0 free (chat 6, code 2)"),
			views: []*llmgwv1.ReplicaView{rv(0, ready, "")}, state: StateUnplaced, why: []string{"4 of 10 replicas cannot be placed: each needs 1 GPU; n1 has 8, 0 free (chat 6, code 2)"},
			want: [4]uint32{10, 6, 6, 0}},
		{name: "unplaced without a reason yet", m: scaled, st: status(10, 6, 6, 0, ""), state: StateUnplaced,
			why: []string{"4 of 10 replicas not placed yet; the leader has not said why yet"}, want: [4]uint32{10, 6, 6, 0}},
		{name: "placed and starting", m: fixed, st: status(2, 2, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, starting, "loading weights")},
			state: StateStarting, why: []string{"1 placed, not ready yet: chat-1 starting (loading weights)"}, want: [4]uint32{2, 2, 1, 0}},
		{name: "placed, no report yet", m: fixed, st: status(2, 2, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, 0, "")},
			state: StateStarting, why: []string{"chat-1 no status"}},
		{name: "a report for an earlier placement is not this one's", m: fixed, st: status(1, 1, 0, 0, ""),
			views: []*llmgwv1.ReplicaView{{Replica: &llmgwv1.Replica{Id: "chat-0", Uid: 9, Model: "chat"}, Status: &llmgwv1.ReplicaStatus{Uid: 3, Phase: restarting, Message: "old"}}},
			state: StateStarting, why: []string{"chat-0 no status"}},
		{name: "a crash loop", m: fixed, st: status(2, 2, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, restarting, "exit status 1: CUDA out of memory")},
			state: StateNotReady, why: []string{"chat-1 restarting (exit status 1: CUDA out of memory)"}},
		{name: "unplaced and starting, both said", m: scaled, st: status(4, 3, 2, 0, "1 of 4 cannot be placed: no node matches gpu=h100"),
			views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, ready, ""), rv(2, starting, "")}, state: StateUnplaced,
			why: []string{"no node matches gpu=h100", "1 placed, not ready yet: chat-2 starting"}},
		{name: "ready by the replica list read after the count", m: fixed, st: status(2, 2, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, ready, "")},
			state: StateStarting, why: []string{"1 of 2 ready when the leader counted"}},
		{name: "waking from sleep", m: scaled, st: status(2, 2, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, sleeping, "")},
			state: StateStarting, why: []string{"chat-1 waking"}},
		{name: "asleep beside the count", m: scaled, st: status(1, 2, 1, 1, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, ""), asleep(rv(1, sleeping, ""))},
			state: StateReady, want: [4]uint32{1, 2, 1, 1}},
		{name: "draining replicas are not the model's", m: fixed, st: status(2, 2, 1, 0, ""),
			views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, starting, ""), draining(rv(2, restarting, "stopping"))},
			state: StateStarting, why: []string{"1 placed, not ready yet: chat-1 starting"}},
		{name: "many not ready", m: fixed, st: status(6, 6, 0, 0, ""),
			views: []*llmgwv1.ReplicaView{rv(0, starting, ""), rv(1, starting, ""), rv(2, starting, ""), rv(3, starting, ""), rv(4, starting, ""), rv(5, starting, "")},
			state: StateStarting, why: []string{"6 placed, not ready yet: chat-0 starting, chat-1 starting, chat-2 starting, chat-3 starting and 2 more"}},
		{name: "scaled to zero", m: scaled, st: status(0, 0, 0, 0, ""), state: StateIdle, why: []string{"scaled to zero"}},
		{name: "scaled to zero, the last replica not drained yet", m: scaled, st: status(0, 1, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, "")},
			state: StateIdle, why: []string{"scaled to zero", "1 placed above the count, to be drained or put to sleep once idle"}},
		{name: "scaled down, surplus not drained yet", m: scaled, st: status(2, 3, 3, 0, ""), state: StateReady, why: []string{"1 placed above the count"}},
		{name: "replicas 0", m: &llmgwv1.Model{Name: "chat", Engine: "vllm"}, st: status(0, 0, 0, 0, ""), state: StateIdle, why: []string{"replicas: 0"}},
		{name: "external: one per endpoint", m: external, st: status(1, 1, 1, 0, ""), views: []*llmgwv1.ReplicaView{rv(0, ready, "")},
			state: StateUnplaced, why: []string{"1 of 2 replicas not placed yet"}, want: [4]uint32{2, 1, 1, 0}},
		{name: "no status, fixed: counted from the replica list", m: fixed, err: noLeader, views: []*llmgwv1.ReplicaView{rv(0, ready, "")},
			state: StateUnplaced, why: []string{"1 of 2 replicas not placed"}, want: [4]uint32{2, 1, 1, 0}},
		{name: "no status, fixed, all there", m: fixed, err: noLeader, views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, ready, "")},
			state: StateReady, want: [4]uint32{2, 2, 2, 0}},
		{name: "no status, autoscaled: the count is unknown", m: scaled, err: noLeader, views: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, starting, "")},
			state: StateUnknown, why: []string{"count is unknown", "chat-1 starting"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := summarize(tc.m, tc.st, tc.err, tc.views)
			if s.State != tc.state {
				t.Errorf("state %q, want %q (%+v)", s.State, tc.state, s)
			}
			if len(tc.why) == 0 && s.Why != "" {
				t.Errorf("why %q, want none", s.Why)
			}
			for _, w := range tc.why {
				if !strings.Contains(s.Why, w) {
					t.Errorf("why %q lacks %q", s.Why, w)
				}
			}
			if tc.want != ([4]uint32{}) && [4]uint32{s.Desired, s.Placed, s.Ready, s.Asleep} != tc.want {
				t.Errorf("desired/placed/ready/asleep %d/%d/%d/%d, want %v", s.Desired, s.Placed, s.Ready, s.Asleep, tc.want)
			}
			if (tc.err != nil) != (s.Error != "") {
				t.Errorf("error %q, want one: %v", s.Error, tc.err != nil)
			}
		})
	}
}

// TestSummaryAlwaysSaysWhy: whatever the leader's counts and the replica
// list say (read apart, they may disagree), a model with fewer replicas
// ready than its count is never shown without a reason — the "6 / 10
// ready" with an empty message that issue 30 reports.
func TestSummaryAlwaysSaysWhy(t *testing.T) {
	phases := []llmgwv1.ReplicaPhase{0, ready, starting, restarting, sleeping}
	m := &llmgwv1.Model{Name: "chat", Engine: "vllm", Replicas: 3}
	checked := 0
	for desired := range uint32(4) {
		for placed := range uint32(4) {
			for rdy := range placed + 1 {
				for slp := range placed - rdy + 1 {
					for _, reason := range []string{"", "no node matches"} {
						for combo := range len(phases) * len(phases) {
							views := []*llmgwv1.ReplicaView{rv(0, phases[combo%len(phases)], ""), rv(1, phases[combo/len(phases)], "")}
							if combo%3 == 0 {
								views[1].Replica.Sleeping = true
							}
							for _, err := range []error{nil, errors.New("no leader")} {
								var st *llmgwv1.ModelStatusResponse
								if err == nil {
									st = &llmgwv1.ModelStatusResponse{Desired: desired, Placed: placed, Ready: rdy, Sleeping: slp, UnplacedReason: reason}
								}
								s := summarize(m, st, err, views)
								checked++
								if s.Ready < s.Desired && s.Why == "" {
									t.Fatalf("%d / %d ready and no reason: status %v, err %v, replicas %v", s.Ready, s.Desired, st, err, views)
								}
								if s.State == "" {
									t.Fatalf("no state: %+v", s)
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d combinations, each with a reason when short", checked)
}

// TestModelsPageStatus: the models page carries each model's ModelStatus
// (the leader's reason, the decisions) and its summary, one call per
// model; a model whose status fails says why in its summary and once
// above the page.
func TestModelsPageStatus(t *testing.T) {
	at := time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC).UnixMilli()
	admin := &fakeAdmin{
		models: []*llmgwv1.Model{
			{Name: "chat", Engine: "vllm", Replicas: 1, Autoscale: &llmgwv1.Autoscale{Max: 10, TargetWaiting: 2}},
			{Name: "code", Engine: "vllm", Replicas: 1},
			{Name: "gone", Engine: "vllm", Replicas: 1},
		},
		replicas: []*llmgwv1.ReplicaView{rv(0, ready, ""), rv(1, starting, "")},
		statuses: map[string]*llmgwv1.ModelStatusResponse{
			"chat": {Desired: 10, Placed: 2, Ready: 1, UnplacedReason: "8 of 10 replicas cannot be placed: n1 has 0 GPUs free",
				Events: []*llmgwv1.ScaleEvent{{UnixMs: at, From: 2, To: 10, Reason: "waiting for 1 starting replicas", Blocked: true}},
				Demand: &llmgwv1.ModelDemand{Held: 3, Waiting: 40}},
			"code": {Desired: 1, Placed: 1, Ready: 1},
		},
	}
	c := New(admin, Access{}, nil, nil, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	c.Register(mux)
	pg := get(t, mux, "/ui/api/models")

	var status map[string]json.RawMessage
	if err := json.Unmarshal(pg["status"], &status); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"unplaced_reason":"8 of 10 replicas cannot be placed`, `"blocked":true`, `"held":"3"`, `"desired":10`} {
		if !strings.Contains(string(status["chat"]), w) {
			t.Errorf("chat's status %s lacks %s", status["chat"], w)
		}
	}
	var sum map[string]ModelSummary
	if err := json.Unmarshal(pg["summary"], &sum); err != nil {
		t.Fatal(err)
	}
	if s := sum["chat"]; s.State != StateUnplaced || !strings.Contains(s.Why, "cannot be placed") || !strings.Contains(s.Why, "chat-1 starting") {
		t.Errorf("chat's summary %+v", s)
	}
	if s := sum["code"]; s.State != StateReady || s.Why != "" {
		t.Errorf("code's summary %+v", s)
	}
	if s := sum["gone"]; !strings.Contains(s.Error, "not found") || s.Why == "" {
		t.Errorf("gone's summary %+v: want its error and a reason for 0 / 1 ready", s)
	}
	var errs map[string]string
	if err := json.Unmarshal(pg["errors"], &errs); err != nil || !strings.Contains(errs["model status"], "1 of 3 models without status, gone:") {
		t.Errorf("errors %s", pg["errors"])
	}
	if admin.statusCalls != 3 {
		t.Errorf("%d ModelStatus calls for 3 models, want one each", admin.statusCalls)
	}
}

// TestModelStatusCallsBounded: a page makes StatusParallel ModelStatus
// calls at a time however slow the leader, answers within its timeout, and
// reads the status of MaxStatusModels models at most.
func TestModelStatusCallsBounded(t *testing.T) {
	admin := &fakeAdmin{statusBlock: true}
	for i := range 3 * StatusParallel {
		admin.models = append(admin.models, &llmgwv1.Model{Name: fmt.Sprintf("m%d", i), Engine: "vllm", Replicas: 1})
	}
	c := New(admin, Access{}, nil, nil, slog.New(slog.DiscardHandler))
	c.timeout = 300 * time.Millisecond
	mux := http.NewServeMux()
	c.Register(mux)
	pg := get(t, mux, "/ui/api/models")
	if admin.maxInFlight != StatusParallel {
		t.Errorf("%d ModelStatus calls at once, want %d", admin.maxInFlight, StatusParallel)
	}
	var sum map[string]ModelSummary
	if err := json.Unmarshal(pg["summary"], &sum); err != nil {
		t.Fatal(err)
	}
	if s := sum["m0"]; !strings.Contains(s.Error, "DeadlineExceeded") || s.Why == "" {
		t.Errorf("m0's summary %+v: want the deadline and a reason", s)
	}

	admin.statusBlock, admin.statusCalls, admin.models = false, 0, nil
	for i := range MaxStatusModels + 10 {
		admin.models = append(admin.models, &llmgwv1.Model{Name: fmt.Sprintf("m%d", i), Engine: "vllm", Replicas: 1})
	}
	pg = get(t, mux, "/ui/api/models")
	if admin.statusCalls != MaxStatusModels {
		t.Errorf("%d ModelStatus calls for %d models, want %d", admin.statusCalls, len(admin.models), MaxStatusModels)
	}
	if err := json.Unmarshal(pg["summary"], &sum); err != nil {
		t.Fatal(err)
	}
	last := fmt.Sprintf("m%d", MaxStatusModels+9)
	if s := sum[last]; !strings.Contains(s.Error, fmt.Sprintf("status of %d models at most", MaxStatusModels)) {
		t.Errorf("%s's summary %+v", last, s)
	}
}
