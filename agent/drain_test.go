package agent

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestDrainStopsIdleEngine: a replica the desired set marks draining keeps
// its engine while the engine reports a request running, and has it stopped
// (reported STOPPED, its process gone) once the engine is idle for the
// quiet period, or once the drain timeout passes however busy it is. The
// placement is forgotten only when the desired set drops it.
func TestDrainStopsIdleEngine(t *testing.T) {
	tests := []struct {
		name       string
		timeout    time.Duration
		releaseAt  int // idle once this many busy readings were taken; 0: never
		wantResult string
	}{
		{"stopped once idle", time.Minute, 10, "idle"},
		{"stopped at the timeout while busy", 400 * time.Millisecond, 0, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl := startFakeControl(t, "c1")
			c := testConfig(t, ctl.addr)
			busy := filepath.Join(c.DataDir, "busy")
			if err := os.WriteFile(busy, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			sim := c.Engines["sim"]
			sim.Env[fakeengine.EnvBusy] = busy
			c.Engines["sim"] = sim
			c.DrainQuiet, c.DrainTimeout = 200*time.Millisecond, tt.timeout
			a, stop := startAgent(t, c)
			defer stop()

			rep := &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"}
			ctl.push <- desired(10, rep)
			phase := func() llmgwv1.ReplicaPhase {
				_, ups := ctl.snapshot()
				return latest(ups, 0)["demo-0"].GetPhase()
			}
			testkit.Wait(t, "demo-0 READY", func() bool { return phase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY })
			testkit.Wait(t, "a busy reading", func() bool {
				return testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"}) > 0
			})

			draining := &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1", Draining: true}
			ctl.push <- desired(11, draining)
			if tt.releaseAt > 0 {
				from := testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"})
				testkit.Wait(t, "busy readings while draining", func() bool {
					return testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"}) >= from+float64(tt.releaseAt)
				})
				if p := phase(); p != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
					t.Fatalf("a busy draining engine went %v", p)
				}
				if err := os.Remove(busy); err != nil {
					t.Fatal(err)
				}
			}
			testkit.Wait(t, "demo-0 STOPPED", func() bool { return phase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED })
			testkit.Wait(t, "the drain counted", func() bool {
				return testkit.Metric(t, a.reg, "llmgw_agent_drains_total", testkit.Labels{"result": tt.wantResult}) == 1
			})
			recs, err := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 {
				t.Fatalf("%d engine starts, want 1 (a drained engine is not restarted)", len(recs))
			}
			if err := syscall.Kill(recs[0].Pid, 0); err == nil {
				t.Errorf("drained engine pid %d still runs", recs[0].Pid)
			}
			// Stopped but still desired: the same set again changes nothing.
			ctl.push <- desired(12, draining)
			ctl.push <- desired(13)
			testkit.Wait(t, "demo-0 removed", func() bool {
				_, ups := ctl.snapshot()
				return slices.ContainsFunc(ups, func(u *llmgwv1.EphemeralUpdate) bool { return slices.Contains(u.GetRemovedReplicas(), "demo-0") })
			})
			if recs, _ := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl")); len(recs) != 1 {
				t.Errorf("%d engine starts after removal, want 1", len(recs))
			}
		})
	}
}

// TestDrainingOnArrivalStartsNothing: a replica first seen already draining
// (a drain the previous agent did not finish, its engine gone) is not
// started just to be stopped.
func TestDrainingOnArrivalStartsNothing(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	_, stop := startAgent(t, c)
	defer stop()
	ctl.push <- desired(10, &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1", Draining: true},
		&llmgwv1.Replica{Id: "demo-1", Uid: 6, Model: "demo", Node: "n1"})
	testkit.Wait(t, "demo-1 READY", func() bool {
		_, ups := ctl.snapshot()
		return latest(ups, 0)["demo-1"].GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	})
	_, ups := ctl.snapshot()
	if st, ok := latest(ups, 0)["demo-0"]; ok {
		t.Errorf("draining-on-arrival replica reported %v", st)
	}
	recs, err := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Errorf("%d engine starts, want 1", len(recs))
	}
}
