package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"

	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// A kv_events replica's engine is given a KV endpoint the agent listens
// on; what the engine publishes reaches the control node as net changes,
// and whole in every full copy (design §7.5 step 2).
// kvEndpointOf waits for the (fake) engine the agent of c started and
// returns where it was told to publish its KV events.
func kvEndpointOf(t *testing.T, c Config) string {
	t.Helper()
	var endpoint string
	testkit.Wait(t, "the engine's start", func() bool {
		recs, _ := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
		for _, r := range recs {
			if i := slices.IndexFunc(r.Argv, func(a string) bool { return strings.HasPrefix(a, "--kv-events-config=") }); i >= 0 {
				var cfg struct {
					Endpoint string `json:"endpoint"`
				}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(r.Argv[i], "--kv-events-config=")), &cfg); err != nil {
					t.Fatal(err)
				}
				endpoint = cfg.Endpoint
				return true
			}
		}
		return false
	})
	return endpoint
}

// publishAt binds a PUB socket where the engine was told to publish, as
// the engine would, and waits for the agent's subscription; it is closed
// when the test ends.
func publishAt(t *testing.T, endpoint string) zmq4.Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	t.Cleanup(func() { pub.Close(); cancel() })
	if err := pub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "the agent's subscription", func() bool { return slices.Contains(pub.(zmq4.Topics).Topics(), "kv") })
	return pub
}

// TestKVMirrorBoundByEngineCache: the agent bounds an engine's KV mirror
// by the cache the engine says it has (vllm:cache_config_info's
// num_gpu_blocks, read as it turns READY), not only by the configured cap:
// an engine that publishes more blocks than its cache holds is not this
// engine's cache, and its replica is reported untrusted.
func TestKVMirrorBoundByEngineCache(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	_, stop := startAgent(t, c)
	defer stop()
	testkit.Wait(t, "the welcome's full copy", func() bool { _, u := ctl.snapshot(); return len(u) >= 1 })
	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{
		Revision: 3, Replicas: []*llmgwv1.Replica{{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"}},
		Models: []*llmgwv1.Model{{Name: "demo", Engine: "sim", Model: "org/demo", Replicas: 1,
			KvEvents: true, BlockSize: 4, HashSeed: "7", ExtraArgs: []string{"--num-gpu-blocks-override=2"}}},
	}}}
	endpoint := kvEndpointOf(t, c)
	testkit.Wait(t, "the engine READY with its cache size", func() bool {
		_, ups := ctl.snapshot()
		return slices.ContainsFunc(ups, func(u *llmgwv1.EphemeralUpdate) bool {
			return slices.ContainsFunc(u.GetStatuses(), func(st *llmgwv1.ReplicaStatus) bool {
				return st.GetReplicaId() == "demo-0" && st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && st.GetKvCacheBlocks() == 2
			})
		})
	})

	pub := publishAt(t, endpoint)
	tokens := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	hs, err := vllm.BlockHashes(vllm.NoneHash("7"), tokens, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stored []vllm.ExternalBlockHash
	for _, h := range hs {
		stored = append(stored, vllm.ExternalHash(h, true))
	}
	// Three blocks from an engine whose cache holds two (the configured cap
	// is far above).
	payload, err := vllm.EncodeEventBatch(vllm.EventBatch{TS: 1, Events: []vllm.Event{&vllm.BlockStored{
		BlockHashes: stored, TokenIDs: tokens, BlockSize: 4, Medium: vllm.Ptr(vllm.MediumGPU)}}}, vllm.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames("kv", 0, payload)...)); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "the replica reported untrusted, its mirror empty", func() bool {
		_, ups := ctl.snapshot()
		return slices.ContainsFunc(ups, func(u *llmgwv1.EphemeralUpdate) bool {
			return slices.ContainsFunc(u.GetKv(), func(b *llmgwv1.KVBlocks) bool {
				return b.GetReplicaId() == "demo-0" && b.GetUntrusted() && len(b.GetStored()) == 0
			})
		})
	})
}

func TestKVEventsReachControl(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	_, stop := startAgent(t, c)
	testkit.Wait(t, "the welcome's full copy", func() bool { _, u := ctl.snapshot(); return len(u) >= 1 })

	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{
		Revision: 3, Replicas: []*llmgwv1.Replica{{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"}},
		Models: []*llmgwv1.Model{{Name: "demo", Engine: "sim", Model: "org/demo", Replicas: 1,
			KvEvents: true, BlockSize: 4, HashSeed: "7"}},
	}}}
	kvOf := func(pred func(u *llmgwv1.EphemeralUpdate, b *llmgwv1.KVBlocks) bool) func() bool {
		return func() bool {
			_, ups := ctl.snapshot()
			return slices.ContainsFunc(ups, func(u *llmgwv1.EphemeralUpdate) bool {
				return slices.ContainsFunc(u.GetKv(), func(b *llmgwv1.KVBlocks) bool { return pred(u, b) })
			})
		}
	}
	testkit.Wait(t, "the new engine's reset", kvOf(func(_ *llmgwv1.EphemeralUpdate, b *llmgwv1.KVBlocks) bool {
		return b.GetReplicaId() == "demo-0" && b.GetUid() == 5 && b.GetIncarnation() == 1 && b.GetReset_() &&
			b.GetBlockSize() == 4 && len(b.GetStored()) == 0
	}))

	// The engine was told where to publish.
	endpoint := kvEndpointOf(t, c)
	// An ipc socket in the agent's own directory (issue 27), which the
	// engine binds.
	if !strings.HasPrefix(endpoint, "ipc://"+filepath.Join(c.DataDir, "kv")+"/") {
		t.Fatalf("kv endpoint %q", endpoint)
	}
	if fi, err := os.Stat(filepath.Join(c.DataDir, "kv")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket dir: %v %v, want mode 0700", fi.Mode(), err)
	}

	// Publish as the engine would.
	pub := publishAt(t, endpoint)
	tokens := []int{1, 2, 3, 4, 5, 6, 7, 8}
	hs, err := vllm.BlockHashes(vllm.NoneHash("7"), tokens, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := vllm.EncodeEventBatch(vllm.EventBatch{TS: 1, Events: []vllm.Event{&vllm.BlockStored{
		BlockHashes: []vllm.ExternalBlockHash{vllm.ExternalHash(hs[0], true), vllm.ExternalHash(hs[1], true)},
		TokenIDs:    tokens, BlockSize: 4, Medium: vllm.Ptr(vllm.MediumGPU)}}}, vllm.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames("kv", 0, payload)...)); err != nil {
		t.Fatal(err)
	}
	want := []uint64{hs[0].Uint64(), hs[1].Uint64()}
	slices.Sort(want)
	testkit.Wait(t, "the blocks as a delta", kvOf(func(u *llmgwv1.EphemeralUpdate, b *llmgwv1.KVBlocks) bool {
		// With the engine's time of the batch (ts 1 s), for the lag metrics.
		return !u.GetFull() && !b.GetReset_() && slices.Equal(b.GetStored(), want) &&
			b.GetOldestEventUnixNano() == 1e9 && b.GetNewestEventUnixNano() == 1e9
	}))

	// Every full copy holds them, as a reset.
	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_FullCopyRequest{FullCopyRequest: &llmgwv1.FullCopyRequest{Reason: "test"}}}
	testkit.Wait(t, "the blocks in a full copy", kvOf(func(u *llmgwv1.EphemeralUpdate, b *llmgwv1.KVBlocks) bool {
		return u.GetFull() && b.GetReset_() && b.GetIncarnation() == 1 && slices.Equal(b.GetStored(), want)
	}))
	hellos, ups := ctl.snapshot()
	for _, h := range hellos {
		checkOrder(t, ups, h.GetEpoch())
	}
	stop()
}
