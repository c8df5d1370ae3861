package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAgentSleepsTheSimulator runs the agent's supervisor against the
// simulator as a process, started with the sim driver's argv for a model
// with autoscale.sleep: the engine loads for its simulated start, is put
// to sleep (its weights offloaded, vllm:engine_sleep_state says so) and
// woken, and serves again — the two sides of design §6 "Sleep" and §8
// "Loading and sleeping" against each other.
func TestAgentSleepsTheSimulator(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	port := freeTCPPort(t)
	l, err := engine.Plan(engine.Spec{
		Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 3},
		Model: &llmgwv1.Model{Name: "demo", Engine: engine.Sim, Model: "meta-llama/Llama-3.1-8B-Instruct",
			Autoscale: &llmgwv1.Autoscale{Max: 2, TargetWaiting: 1, Sleep: true},
			// 2 % of an L4's load: a start of about 0.5 s.
			ExtraArgs: []string{"--sim-gpu", "l4", "--sim-load-scale", "0.02"}},
		Host: "127.0.0.1", Port: port, Command: []string{self, "sim"},
		Env: map[string]string{envRunMain: "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := supervisor.DefaultConfig()
	c.ReplicaID, c.UID, c.Model, c.Node = "demo-0", 3, "demo", "n1"
	c.Launch, c.LogPath = l, filepath.Join(t.TempDir(), "engine.log")
	c.ProbeInterval, c.PollInterval, c.StopGrace, c.Pdeathsig = 20*time.Millisecond, 10*time.Millisecond, 5*time.Second, true
	var (
		mu  sync.Mutex
		sts []*llmgwv1.ReplicaStatus
	)
	last := func() *llmgwv1.ReplicaStatus {
		mu.Lock()
		defer mu.Unlock()
		if len(sts) == 0 {
			return nil
		}
		return sts[len(sts)-1]
	}
	is := func(p llmgwv1.ReplicaPhase) func() bool { return func() bool { return last().GetPhase() == p } }
	sup := supervisor.New(c, func(st *llmgwv1.ReplicaStatus) { mu.Lock(); sts = append(sts, st); mu.Unlock() },
		slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- sup.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testkit.WaitWithin(t, 20*time.Second, "READY", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	if took := time.Since(began); took < 400*time.Millisecond {
		t.Errorf("ready after %v: the simulated start (about 0.5 s) was skipped", took)
	}
	base := strings.TrimSuffix(l.HealthURL, "/health")
	metric := func(state string) bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return slices.Contains(strings.Split(string(b), "\n"),
			`vllm:engine_sleep_state{engine="0",model_name="demo",sleep_state="`+state+`"} 1`)
	}
	sup.SetSleeping(true)
	testkit.WaitWithin(t, 20*time.Second, "SLEEPING", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING))
	if !metric("weights_offloaded") {
		t.Error("asleep, but the engine's metrics do not say weights_offloaded")
	}
	sup.SetSleeping(false)
	testkit.WaitWithin(t, 20*time.Second, "READY again", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	if !metric("awake") {
		t.Error("awake, but the engine's metrics do not say so")
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"demo","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"finish_reason":"length"`) {
		t.Errorf("after the wake: %s %s", resp.Status, b)
	}
	if st := last(); st.GetIncarnation() != 1 || st.GetRestarts() != 0 {
		t.Errorf("status %v: want the first engine, never restarted", st)
	}
}
