package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// reap collects an engine the test process ended up parent of (the agent
// runs in the test process, so its engines are the test's children).
func reap(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(pid, &ws, 0, nil)
}

// TestReadoptsEnginesAfterRestart: an agent that exits without
// --stop-engines-on-exit leaves its engine and a record of it; the next
// agent on the same data dir supervises the same process under the same
// incarnation, READY before any desired set arrives, and the first desired
// set decides its fate (design §6).
func TestReadoptsEnginesAfterRestart(t *testing.T) {
	tests := []struct {
		name string
		// between runs while no agent runs.
		between func(t *testing.T, pid int)
		// next is the first desired set the second agent gets.
		next *llmgwv1.Replica
		// adopted: the second agent reports the first engine's pid and
		// incarnation; starts: engine starts in all.
		adopted bool
		starts  int
	}{
		{"still desired", nil, &llmgwv1.Replica{Id: "demo-0", Uid: 2, Model: "demo", Node: "n1"}, true, 1},
		{"re-placed under a new uid", nil, &llmgwv1.Replica{Id: "demo-0", Uid: 9, Model: "demo", Node: "n1"}, true, 2},
		{"no longer desired", nil, nil, true, 1},
		{"engine died meanwhile", func(t *testing.T, pid int) { reap(pid) },
			&llmgwv1.Replica{Id: "demo-0", Uid: 2, Model: "demo", Node: "n1"}, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl := startFakeControl(t, "c1")
			c := testConfig(t, ctl.addr)
			c.StopEnginesOnExit = false
			_, stop := startAgent(t, c)
			ctl.push <- desired(3, &llmgwv1.Replica{Id: "demo-0", Uid: 2, Model: "demo", Node: "n1"})
			var first *llmgwv1.ReplicaStatus
			testkit.Wait(t, "replica READY", func() bool {
				_, ups := ctl.snapshot()
				first = latest(ups, 0)["demo-0"]
				return first.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
			})
			pid := int(first.GetPid())
			t.Cleanup(func() { reap(pid) })
			stop()
			if _, err := os.Stat(filepath.Join(c.DataDir, "engines", "demo-0.json")); err != nil {
				t.Fatalf("no engine record after a detached exit: %v", err)
			}
			if tt.between != nil {
				tt.between(t, pid)
			}

			hellos, _ := ctl.snapshot()
			_, stop2 := startAgent(t, c)
			testkit.Wait(t, "second session's full copy", func() bool {
				h, ups := ctl.snapshot()
				if len(h) <= len(hellos) {
					return false
				}
				for _, u := range ups {
					if u.GetEpoch() == h[len(hellos)].GetEpoch() {
						return true
					}
				}
				return false
			})
			h, ups := ctl.snapshot()
			epoch := h[len(hellos)].GetEpoch()
			if listed := len(h[len(hellos)].GetRunning()) == 1; listed != tt.adopted {
				t.Errorf("second hello lists %v running; adopted = %v", h[len(hellos)].GetRunning(), tt.adopted)
			}
			got := latest(ups, epoch)["demo-0"]
			if tt.adopted {
				if got.GetPid() != int32(pid) || got.GetIncarnation() != first.GetIncarnation() ||
					got.GetUid() != 2 || got.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
					t.Errorf("after restart demo-0 is %v; want READY pid %d incarnation %d", got, pid, first.GetIncarnation())
				}
			} else if got != nil {
				t.Errorf("a dead engine was reported: %v", got)
			}

			if tt.next == nil {
				ctl.push <- desired(4)
				testkit.Wait(t, "demo-0 removed", func() bool {
					_, ups := ctl.snapshot()
					_, ok := latest(ups, epoch)["demo-0"]
					return !ok
				})
				testkit.Wait(t, "engine stopped", func() bool { return !alive(pid) })
			} else {
				ctl.push <- desired(4, tt.next)
				testkit.Wait(t, "demo-0 READY under the desired uid", func() bool {
					_, ups := ctl.snapshot()
					s := latest(ups, epoch)["demo-0"]
					return s.GetUid() == tt.next.GetUid() && s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
				})
				_, ups = ctl.snapshot()
				s := latest(ups, epoch)["demo-0"]
				if kept := s.GetPid() == int32(pid); kept != (tt.adopted && tt.next.GetUid() == 2) {
					t.Errorf("engine pid %d after the desired set (first %d)", s.GetPid(), pid)
				}
				if tt.next.GetUid() != 2 && alive(pid) {
					t.Errorf("re-placed replica's adopted engine %d still runs", pid)
				}
				if s.GetPid() != int32(pid) {
					t.Cleanup(func() { reap(int(s.GetPid())) })
				}
			}
			recs, err := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != tt.starts {
				t.Errorf("%d engine starts, want %d", len(recs), tt.starts)
			}
			stop2()
		})
	}
}

// alive reports whether pid runs; a zombie counts as gone.
func alive(pid int) bool {
	_, err := supervisor.ProcStartTime(pid)
	return err == nil
}
