//go:build !llmgw_upgrade_old

package fsm

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func elastic(name string, a *llmgwv1.Autoscale) *llmgwv1.Model {
	return &llmgwv1.Model{Name: name, Engine: "sim", Model: "org/" + name, Replicas: max(1, a.GetMin()), GpusPerReplica: 1, Autoscale: a}
}

func scaleCmd(t testing.TB, model string, n uint32, rev uint64) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE, &llmgwv1.SetModelScaleCommand{Model: model, Replicas: n, Reason: "test", ModelRevision: rev})
}

func TestCheckAutoscale(t *testing.T) {
	ok := func() *llmgwv1.Autoscale { return &llmgwv1.Autoscale{Min: 0, Max: 4, TargetWaiting: 2} }
	for _, tc := range []struct {
		name  string
		edit  func(m *llmgwv1.Model)
		field string // "" when valid
	}{
		{"valid", func(*llmgwv1.Model) {}, ""},
		{"no autoscale", func(m *llmgwv1.Model) { m.Autoscale = nil }, ""},
		{"max 0", func(m *llmgwv1.Model) { m.Autoscale.Max = 0 }, "autoscale.max"},
		{"max too large", func(m *llmgwv1.Model) { m.Autoscale.Max = MaxAutoscaleReplicas + 1 }, "autoscale.max"},
		{"min above max", func(m *llmgwv1.Model) { m.Autoscale.Min, m.Replicas = 5, 5 }, "autoscale.min"},
		{"no target", func(m *llmgwv1.Model) { m.Autoscale.TargetWaiting = 0 }, "autoscale"},
		{"kv target above 1", func(m *llmgwv1.Model) { m.Autoscale.TargetKvUsage = 1.5 }, "autoscale.target_kv_usage"},
		{"negative waiting", func(m *llmgwv1.Model) { m.Autoscale.TargetWaiting = -1 }, "autoscale.target_waiting"},
		{"ttft only", func(m *llmgwv1.Model) { m.Autoscale.TargetWaiting, m.Autoscale.TtftP90SloMs = 0, 500 }, ""},
		{"ttft too long", func(m *llmgwv1.Model) { m.Autoscale.TtftP90SloMs = maxTTFTSLOMillis + 1 }, "autoscale.ttft_p90_slo_ms"},
		{"replicas above max", func(m *llmgwv1.Model) { m.Replicas = 5 }, "replicas"},
		{"sleep on llamacpp", func(m *llmgwv1.Model) { m.Engine, m.Autoscale.Sleep = "llamacpp", true }, "autoscale.sleep"},
		{"sleep on sim", func(m *llmgwv1.Model) { m.Autoscale.Sleep = true }, ""},
		{"sleep mode by hand", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--enable_sleep_mode"} }, "extra_args[0]"},
		{"cooldown a day and more", func(m *llmgwv1.Model) { m.Autoscale.CooldownS = maxScaleSeconds + 1 }, "autoscale.cooldown_s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := elastic("chat", ok())
			tc.edit(m)
			err := ValidateModel(ModelDefaults(m))
			var ve *ValidationError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.field != "" && (!errors.As(err, &ve) || ve.Field != tc.field):
				t.Fatalf("err %v, want a validation error on %s", err, tc.field)
			}
		})
	}
}

func TestSetModelScale(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 2, upsert(t, elastic("chat", &llmgwv1.Autoscale{Min: 0, Max: 4, TargetWaiting: 2})))
	mustApply(t, f, 3, upsert(t, validModel())) // "demo": no autoscale
	rev := f.State().Models[0].Revision
	for i, tc := range []struct {
		name string
		cmd  []byte
		want string // an error's words; "" when applied
	}{
		{"unknown model", scaleCmd(t, "nope", 1, rev), "not found"},
		{"no autoscale", scaleCmd(t, "demo", 1, rev), "has no autoscale"},
		{"older revision", scaleCmd(t, "chat", 1, rev-1), "decide again"},
		{"above max", scaleCmd(t, "chat", 5, rev), "outside"},
		{"applied", scaleCmd(t, "chat", 3, rev), ""},
		{"to zero", scaleCmd(t, "chat", 0, rev), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := uint64(10 + i)
			if tc.want != "" {
				if _, err := applyUnchanged(t, f, idx, tc.cmd); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one saying %q", err, tc.want)
				}
				return
			}
			res := mustApply(t, f, idx, tc.cmd)
			s, _ := res.(*llmgwv1.ModelScale)
			if got := f.Scale("chat"); s == nil || !proto.Equal(got, s) || got.Revision != idx {
				t.Fatalf("scale %v (result %v), want the one applied at %d", got, s, idx)
			}
		})
	}
	// A snapshot carries it; a restore brings it back.
	st := f.State()
	if len(st.Scales) != 1 || st.Scales[0].Replicas != 0 {
		t.Fatalf("snapshot scales %v, want chat at 0", st.Scales)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{})
	if err := g.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got := g.Scale("chat"); got == nil || got.Replicas != 0 {
		t.Fatalf("restored scale %v", got)
	}
	// Re-applying with new targets keeps the decision and the revision
	// (nothing restarts); without autoscale the count is the spec's again.
	m := elastic("chat", &llmgwv1.Autoscale{Min: 0, Max: 8, TargetWaiting: 4})
	mustApply(t, f, 30, upsert(t, m))
	if got := f.Scale("chat"); got == nil {
		t.Fatal("re-applying the spec dropped the decision")
	}
	if got := f.State().Models[0].Revision; got != rev {
		t.Fatalf("new targets moved the model's revision %d to %d: its replicas would roll", rev, got)
	}
	m.Autoscale.Sleep = true
	mustApply(t, f, 31, upsert(t, m))
	if got := f.State().Models[0].Revision; got == rev {
		t.Fatal("turning sleep mode on kept the revision: the engines need --enable-sleep-mode")
	}
	m.Autoscale = nil
	mustApply(t, f, 32, upsert(t, m))
	if got := f.Scale("chat"); got != nil {
		t.Fatalf("scale %v kept for a model without autoscale", got)
	}
	mustApply(t, f, 33, upsert(t, elastic("chat", &llmgwv1.Autoscale{Min: 0, Max: 4, TargetWaiting: 2})))
	mustApply(t, f, 34, scaleCmd(t, "chat", 2, f.State().Models[0].Revision))
	mustApply(t, f, 35, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: "chat"}))
	if got := f.Scale("chat"); got != nil {
		t.Fatalf("scale %v outlived its model", got)
	}
}

func TestSetReplicaSleeping(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 2, upsert(t, elastic("chat", &llmgwv1.Autoscale{Min: 0, Max: 4, TargetWaiting: 2, Sleep: true})))
	mustApply(t, f, 3, upsert(t, validModel()))
	mustApply(t, f, 4, register(t, "n1", 2))
	chat := mustApply(t, f, 5, place(t, "", "chat", "n1", 0)).(*llmgwv1.Replica)
	demo := mustApply(t, f, 6, place(t, "", "demo", "n1", 1)).(*llmgwv1.Replica)
	sleep := func(r *llmgwv1.Replica, uid uint64, on bool) []byte {
		return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_SLEEPING, &llmgwv1.SetReplicaSleepingCommand{Id: r.Id, Uid: uid, Sleeping: on})
	}
	if _, err := applyUnchanged(t, f, 7, sleep(demo, demo.Uid, true)); err == nil {
		t.Fatal("a replica of a model without autoscale.sleep was put to sleep")
	}
	if _, err := applyUnchanged(t, f, 8, sleep(chat, chat.Uid+1, true)); err != nil {
		t.Fatalf("another incarnation's sleep: %v, want a no-op", err)
	}
	got := mustApply(t, f, 9, sleep(chat, chat.Uid, true)).(*llmgwv1.Replica)
	if !got.Sleeping || got.Revision != 9 {
		t.Fatalf("replica %v after sleep", got)
	}
	if changes, _ := f.ChangesSince(8); len(changes) != 1 || !changes[0].GetReplica().GetSleeping() {
		t.Fatalf("changes %v, want the sleeping replica for the watchers", changes)
	}
	got = mustApply(t, f, 10, sleep(chat, chat.Uid, false)).(*llmgwv1.Replica)
	if got.Sleeping {
		t.Fatal("wake left it asleep")
	}
	// Asleep again, its GPU goes to another model; it cannot wake on it.
	mustApply(t, f, 11, sleep(chat, chat.Uid, true))
	mustApply(t, f, 12, place(t, "", "demo", "n1", 0))
	if _, err := applyUnchanged(t, f, 13, sleep(chat, chat.Uid, false)); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "GPU 0 of node n1 is held by demo-1") {
		t.Fatalf("waking on a GPU another replica holds: %v, want a conflict naming it", err)
	}
}
