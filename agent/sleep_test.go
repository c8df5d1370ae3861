package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// sleepDesired is desired() for a model whose replicas sleep (autoscale.sleep).
func sleepDesired(rev uint64, reps ...*llmgwv1.Replica) *llmgwv1.ControlMessage {
	m := desired(rev, reps...)
	m.GetDesired().GetModels()[0].Autoscale = &llmgwv1.Autoscale{Max: 2, TargetWaiting: 1, Sleep: true}
	return m
}

// TestSleepFollowsDesiredSet: a replica the desired set marks sleeping
// keeps serving while its engine has a request running, is put to sleep
// once the engine has been idle for the quiet period and reported
// SLEEPING, and is woken and reported READY when the mark is cleared — the
// same engine throughout, never restarted.
func TestSleepFollowsDesiredSet(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	busy := filepath.Join(c.DataDir, "busy")
	if err := os.WriteFile(busy, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sim := c.Engines["sim"]
	sim.Env[fakeengine.EnvBusy] = busy
	c.Engines["sim"] = sim
	c.DrainQuiet = 200 * time.Millisecond
	a, stop := startAgent(t, c)
	defer stop()

	rep := &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"}
	ctl.push <- sleepDesired(10, rep)
	status := func() *llmgwv1.ReplicaStatus {
		_, ups := ctl.snapshot()
		return latest(ups, 0)["demo-0"]
	}
	is := func(p llmgwv1.ReplicaPhase) func() bool { return func() bool { return status().GetPhase() == p } }
	testkit.Wait(t, "demo-0 READY", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))

	asleep := &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1", Sleeping: true}
	ctl.push <- sleepDesired(11, asleep)
	from := testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"})
	testkit.Wait(t, "busy readings", func() bool {
		return testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"}) >= from+10
	})
	if p := status().GetPhase(); p != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
		t.Fatalf("a busy engine went %v", p)
	}
	if err := os.Remove(busy); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "demo-0 SLEEPING", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING))

	ctl.push <- sleepDesired(12, rep)
	testkit.Wait(t, "demo-0 READY again", is(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	recs, err := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var starts int
	var calls []string
	for _, r := range recs {
		if r.Call != "" {
			calls = append(calls, r.Call)
		} else if !r.Grandchild {
			starts++
		}
	}
	if want := []string{"POST /sleep?level=1&mode=abort", "POST /wake_up"}; starts != 1 || !slices.Equal(calls, want) {
		t.Errorf("%d starts and calls %q; want one start, then %q", starts, calls, want)
	}
	if st := status(); st.GetIncarnation() != 1 {
		t.Errorf("awake again as incarnation %d, want the same engine (1)", st.GetIncarnation())
	}
}
