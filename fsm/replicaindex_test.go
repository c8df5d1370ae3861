package fsm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// wantDesired is NodeDesired computed the slow way, from the whole state:
// what the index must always agree with.
func wantDesired(st *llmgwv1.State, node string) *llmgwv1.DesiredReplicas {
	d := &llmgwv1.DesiredReplicas{Revision: st.Revision}
	here := map[string]bool{}
	models := map[string]bool{}
	for _, r := range st.Replicas { // sorted by id
		if r.Node == node {
			d.Replicas = append(d.Replicas, r)
			here[r.Id] = true
			models[r.Model] = true
		}
	}
	for _, m := range st.Models { // sorted by name
		if models[m.Name] {
			d.Models = append(d.Models, m)
		}
	}
	for _, p := range st.AdapterPlacements { // sorted by adapter
		if slices.ContainsFunc(p.Replicas, func(id string) bool { return here[id] }) {
			d.Adapters = append(d.Adapters, p)
		}
	}
	return d
}

// walkRand is the walk's seeded randomness (splitmix64): the fsm package
// imports no randomness, tests included (scripts/importcheck).
type walkRand struct{ state uint64 }

// IntN returns a number in [0, n).
func (r *walkRand) IntN(n int) int {
	r.state += 0x9e3779b97f4a7c15
	x := r.state
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return int(x % uint64(n))
}

// TestNodeDesiredFollowsIndex applies random placements, moves, removals,
// model deletes and restores, and after each compares every node's
// NodeDesired (the index) with the same computed from the whole state.
func TestNodeDesiredFollowsIndex(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := &walkRand{state: seed}
			f := New(Config{})
			idx := uint64(0)
			// done counts the commands of each kind applied without a
			// refusal (a taken GPU is part of the walk), so the walk is
			// known to have moved, removed and deleted.
			done := map[string]int{}
			kind := ""
			apply := func(b []byte) {
				idx++
				if _, err := f.Apply(idx, b); err == nil {
					done[kind]++
				}
			}
			nodes := []string{"n1", "n2", "n3", "n4"}
			for _, n := range nodes {
				apply(register(t, n, 4))
			}
			models := []string{"a", "b", "c"}
			for _, m := range models {
				apply(upsert(t, loraModel(m, 1, m+"-lora")))
			}
			for step := range 400 {
				st := f.State()
				switch op := rng.IntN(10); {
				case op < 4:
					kind = "place"
					m, n := models[rng.IntN(len(models))], nodes[rng.IntN(len(nodes))]
					apply(place(t, "", m, n, uint32(rng.IntN(4))))
				case op < 5 && len(st.Replicas) > 0:
					kind = "move" // a re-placement, most often on another node
					r := st.Replicas[rng.IntN(len(st.Replicas))]
					apply(place(t, r.Id, r.Model, nodes[rng.IntN(len(nodes))], uint32(rng.IntN(4))))
				case op < 7 && len(st.Replicas) > 0:
					kind = "remove"
					r := st.Replicas[rng.IntN(len(st.Replicas))]
					apply(remove(t, r.Id, r.Uid))
				case op < 8 && len(st.Replicas) > 0:
					kind = "adapter"
					r := st.Replicas[rng.IntN(len(st.Replicas))]
					apply(setPlacement(t, r.Model, r.Model+"-lora", r.Id))
				case op < 9:
					m := models[rng.IntN(len(models))]
					if rng.IntN(2) == 0 {
						kind = "delete model"
						apply(mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: m}))
					} else {
						kind = "upsert model"
						apply(upsert(t, loraModel(m, 1, m+"-lora")))
					}
				default: // a restore of the state as it is
					snap, err := f.Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					f = New(Config{})
					if err := f.Restore(snap); err != nil {
						t.Fatal(err)
					}
					done["restore"]++
				}
				st = f.State()
				for _, n := range append(nodes, "nobody") {
					if got, want := f.NodeDesired(n), wantDesired(st, n); !proto.Equal(got, want) {
						t.Fatalf("step %d: NodeDesired(%s) =\n%v\nwant\n%v", step, n, got, want)
					}
				}
			}
			if done["move"] == 0 || done["remove"] == 0 || done["adapter"] == 0 || done["delete model"] == 0 || done["restore"] == 0 {
				t.Fatalf("the walk missed a kind of command: %v", done)
			}
		})
	}
}

// TestPlaceOnSleepingGPU: a GPU whose every holder sleeps may be given to
// a new replica (design §5.7 "Sharing GPUs"); one awake holder keeps it.
func TestPlaceOnSleepingGPU(t *testing.T) {
	sleeping := func(r *llmgwv1.Replica) *llmgwv1.Replica { r.Sleeping = true; return r }
	rep := func(id, model string, gpus ...uint32) *llmgwv1.Replica {
		return &llmgwv1.Replica{Id: id, Uid: 1, Model: model, Node: "n1", GpuIndices: gpus, Weight: 1}
	}
	tests := []struct {
		name    string
		held    []*llmgwv1.Replica
		place   []uint32
		wantErr string // "" = placed
	}{
		{"free GPU", nil, []uint32{0}, ""},
		{"held by an awake replica", []*llmgwv1.Replica{rep("a-0", "a", 0)}, []uint32{0}, `GPU 0 on node "n1" is already given to "a-0"`},
		{"held by a sleeping replica", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0))}, []uint32{0}, ""},
		{"two GPUs, one sleeping, one free", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0, 1))}, []uint32{1, 2}, ""},
		{"held by a sleeper and an awake replica", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0)), rep("c-0", "c", 0)}, []uint32{0}, `already given to "c-0"`},
		{"two sleepers", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0)), sleeping(rep("c-0", "c", 0))}, []uint32{0}, ""},
		{"one sleeping GPU, one awake", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0)), rep("a-1", "a", 1)}, []uint32{0, 1}, `GPU 1 on node "n1" is already given to "a-1"`},
		{"a GPU given twice in one replica", []*llmgwv1.Replica{sleeping(rep("a-0", "a", 0))}, []uint32{0, 0}, "is already given"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &llmgwv1.State{Format: SnapshotFormat, Revision: 10,
				Models: []*llmgwv1.Model{
					{Name: "a", Engine: "sim", Model: "x", Replicas: 1}, {Name: "b", Engine: "sim", Model: "x", Replicas: 1},
					{Name: "c", Engine: "sim", Model: "x", Replicas: 1}},
				Nodes:    []*llmgwv1.Node{{Id: "n1", Gpus: 4, State: llmgwv1.NodeState_NODE_STATE_ACTIVE}},
				Replicas: tt.held}
			b, _ := proto.Marshal(st)
			f := New(Config{})
			if err := f.Restore(b); err != nil {
				t.Fatal(err)
			}
			_, err := f.Apply(11, place(t, "", "b", "n1", tt.place...))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("place: %v", err)
			case tt.wantErr != "" && (err == nil || !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("place: %v, want a conflict saying %q", err, tt.wantErr)
			}
		})
	}
}

// fleetCommands are the commands of a fleet of nodes with 8 GPUs each and
// one model of a one-GPU replica per GPU: the model, the nodes, then the
// placements, round robin over the nodes.
func fleetCommands(b *testing.B, nodes int) (setup, places [][]byte) {
	const gpus = 8
	setup = append(setup, upsert(b, &llmgwv1.Model{Name: "fleet", Engine: "sim", Model: "x", Replicas: uint32(nodes * gpus)}))
	for n := range nodes {
		setup = append(setup, register(b, fmt.Sprintf("n%05d", n), gpus))
	}
	for g := range uint32(gpus) {
		for n := range nodes {
			places = append(places, place(b, "", "fleet", fmt.Sprintf("n%05d", n), g))
		}
	}
	return setup, places
}

func applyFleet(b *testing.B, f *FSM, idx *uint64, cmds [][]byte) {
	for _, c := range cmds {
		*idx++
		if _, err := f.Apply(*idx, c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlaceFleet is the control plane's side of placing a fleet from
// nothing (issue 30): 2,000 one-GPU replicas on 250 nodes of 8 GPUs, each
// placement applied and followed by every node's NodeDesired, as every
// agent session does at every applied entry. One op is one placement with
// its 250 reads.
func BenchmarkPlaceFleet(b *testing.B) {
	const nodes = 250
	setup, places := fleetCommands(b, nodes)
	var f *FSM
	var idx uint64
	next := len(places)
	ids := make([]string, nodes)
	for n := range ids {
		ids[n] = fmt.Sprintf("n%05d", n)
	}
	for b.Loop() {
		if next == len(places) { // the fleet is full: start again from nothing
			b.StopTimer()
			f, idx, next = New(Config{}), 0, 0
			applyFleet(b, f, &idx, setup)
			b.StartTimer()
		}
		applyFleet(b, f, &idx, places[next:next+1])
		next++
		for _, id := range ids {
			_ = f.NodeDesired(id)
		}
	}
}

// BenchmarkNodeDesired is one session's read of its node's desired set in
// full fleets of growing size: what every agent session pays at every
// applied entry. With the index it does not grow with the fleet.
func BenchmarkNodeDesired(b *testing.B) {
	for _, replicas := range []int{100, 2000, 10000} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			setup, places := fleetCommands(b, replicas/8)
			f := New(Config{})
			var idx uint64
			applyFleet(b, f, &idx, setup)
			applyFleet(b, f, &idx, places)
			for b.Loop() {
				if d := f.NodeDesired("n00000"); len(d.Replicas) != 8 {
					b.Fatalf("%d replicas on n00000, want 8", len(d.Replicas))
				}
			}
		})
	}
}
