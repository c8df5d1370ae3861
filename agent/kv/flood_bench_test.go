package kv

import (
	"context"
	"encoding/binary"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/vllm"
)

// BenchmarkFlood measures the listener under issue 27's flood — 5 M
// distinct blocks in 50 batches on the engine's socket — with the bounds
// of before the fix (none: every block mirrored) and after (a cache of
// 65,536 blocks, as the engine's num_gpu_blocks says), side by side in one
// run. It reports the heap in use at its peak and live after the flood,
// and the process's CPU time (user+system) per flood.
//
//	nice -n 19 go test -run '^$' -bench BenchmarkFlood -benchtime 1x -count 3 ./agent/kv/
func BenchmarkFlood(b *testing.B) {
	for _, bc := range []struct {
		name   string
		bounds func(*ListenerConfig)
		blocks int // SetEngineBlocks
	}{
		{"bound=none", func(c *ListenerConfig) { c.MaxBlocks, c.MaxBatchBytes = 1<<40, 1<<50 }, 0},
		{"bound=num_gpu_blocks", func(*ListenerConfig) {}, 65_536},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var peak, live, cpu float64
			for range b.N {
				p, l, c := floodOnce(b, bc.bounds, bc.blocks)
				peak, live, cpu = peak+p, live+l, cpu+c
			}
			n := float64(b.N)
			b.ReportMetric(peak/n, "peak-heap-MiB")
			b.ReportMetric(live/n, "live-heap-MiB")
			b.ReportMetric(cpu/n, "cpu-s")
		})
	}
}

func floodOnce(b *testing.B, bounds func(*ListenerConfig), blocks int) (peakMiB, liveMiB, cpuS float64) {
	b.StopTimer()
	hub, err := NewHub(quiet, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.Topic, cfg.BlockSize = "demo-0", 7, "tcp://127.0.0.1:0", "kv", testBS
	bounds(&cfg)
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	l.Engine(1)
	if blocks > 0 {
		l.SetEngineBlocks(blocks)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Dial(l.Endpoint()); err != nil {
		b.Fatal(err)
	}
	for !slices.Contains(pub.(zmq4.Topics).Topics(), "kv") {
		time.Sleep(time.Millisecond)
	}
	base := heapLive()
	cpu0 := cpuTime()
	stop := heapPeak()
	b.StartTimer()
	var seq uint64
	for first := uint64(1 << 40); first < 1<<40+floodBlocks; first += floodBatch {
		if err := pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames("kv", seq, floodPayload(first, floodBatch))...)); err != nil {
			b.Fatal(err)
		}
		seq++
	}
	for value(hub.metrics.batches)+value(hub.metrics.badBatches) < float64(seq) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	peak := stop()
	cpu := cpuTime() - cpu0
	live := heapLive()
	const mib = 1 << 20
	return float64(peak-min(peak, base)) / mib, (float64(live) - float64(base)) / mib, cpu.Seconds()
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecodeDenseFrame decodes one 16 MiB frame of one-byte hashes,
// the densest expansion a peer can send under the frame cap, without and
// with the listener's decoding limits.
//
//	nice -n 19 go test -run '^$' -bench BenchmarkDecodeDenseFrame -benchmem ./agent/kv/
func BenchmarkDecodeDenseFrame(b *testing.B) {
	const n = 16<<20 - 64
	p := []byte{0x92, 0x01, 0x91, 0x92, 0xac}
	p = append(p, vllm.TagBlockRemoved...)
	p = binary.BigEndian.AppendUint32(append(p, 0xdd), n)
	for range n {
		p = append(p, 0x07)
	}
	lim := vllm.DecodeLimits{MaxDecodedBytes: DefaultMaxBatchBytes, MaxBlockHashes: 2 * DefaultMaxBlocks}
	b.Run("limits=none", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = vllm.DecodeEventBatch(p)
		}
	})
	b.Run("limits=listener", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = vllm.DecodeEventBatchLimited(p, lim)
		}
	})
}
