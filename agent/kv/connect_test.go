package kv

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// bindPub makes the fake engine's PUB socket bind addr, as vLLM does with a
// wildcard endpoint (tcp://*:5557), and returns the bound endpoint.
func (e *fakeEngine) bindPub(addr string) string {
	e.t.Helper()
	e.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
	if err := e.pub.Listen("tcp://" + addr); err != nil {
		e.t.Fatal(err)
	}
	return "tcp://" + e.pub.Addr().String()
}

func (e *fakeEngine) subscribed() bool {
	return slices.Contains(e.pub.(zmq4.Topics).Topics(), "kv")
}

// TestListenerConnects: in connect mode (an engine llmgw does not run,
// design §6) the listener dials the engine's bound publisher, mirrors it,
// and dials it again when the engine comes back after going away — whose
// new process the supervisor names as a new incarnation.
func TestListenerConnects(t *testing.T) {
	reg := prometheus.NewRegistry()
	hub, err := NewHub(quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	eng, replay := newFakeEngine(t, 1000, vllm.EncodingMap, true, false)
	_ = eng.pub.Close() // newFakeEngine's connecting PUB; this engine binds
	pubEP := eng.bindPub("127.0.0.1:0")
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.ReplayEndpoint, cfg.Topic, cfg.BlockSize = "demo-0", 7, pubEP, replay, "kv", testBS
	cfg.Connect = true
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	if l.Endpoint() != pubEP {
		t.Errorf("endpoint %q, want the engine's %q", l.Endpoint(), pubEP)
	}
	l.Engine(1)
	h := &harness{hub: hub, reg: reg, l: l, eng: eng}
	testkit.Wait(t, "the listener to connect and subscribe", eng.subscribed)
	a, ev := eng.stored(nil, toks(1, 8))
	eng.publish(false, ev)
	_, ev = eng.stored(&a[1], toks(50, 4))
	eng.publish(false, ev)
	h.converged(t)

	// The engine goes away and a new process binds the same port.
	_ = eng.pub.Close()
	eng.mu.Lock()
	eng.seq, eng.ring = 0, nil
	clear(eng.held)
	eng.mu.Unlock()
	addr := pubEP[len("tcp://"):]
	testkit.WaitErr(t, 10*time.Second, "rebinding "+addr, func() error {
		pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
		if err := pub.Listen("tcp://" + addr); err != nil {
			_ = pub.Close()
			return err
		}
		eng.pub = pub
		return nil
	})
	l.Engine(2)
	testkit.Wait(t, "the listener to reconnect and subscribe", eng.subscribed)
	_, ev = eng.stored(nil, toks(300, 8))
	eng.publish(false, ev)
	h.converged(t)
	if got, _, _ := hub.Blocks("demo-0"); slices.Contains(got, a[0].Uint64()) {
		t.Error("the old process's blocks outlived its restart")
	}
}

// TestListenerDialsThroughConfig: every TCP connection a connecting
// listener makes — to the engine's publisher and to its replay socket —
// goes through ListenerConfig.Dial, which for an external engine is the
// agent's endpoint guard (design §6 "External engines"), and a refused
// dial leaves the listener unconnected.
func TestListenerDialsThroughConfig(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		hub, err := NewHub(quiet, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		eng, replay := newFakeEngine(t, 1000, vllm.EncodingMap, true, false)
		_ = eng.pub.Close()
		pubEP := eng.bindPub("127.0.0.1:0")
		var mu sync.Mutex
		var dialed []string
		cfg := DefaultListenerConfig()
		cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.ReplayEndpoint, cfg.Topic, cfg.BlockSize = "ext-0", 7, pubEP, replay, "kv", testBS
		cfg.Connect, cfg.CatchUp = true, true
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialed = append(dialed, addr)
			mu.Unlock()
			if refuse {
				return nil, errors.New("refused by the test")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		l, err := hub.Listen(cfg, quiet)
		if err != nil {
			t.Fatal(err)
		}
		seen := func(ep string) func() bool {
			return func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.Contains(dialed, strings.TrimPrefix(ep, "tcp://"))
			}
		}
		testkit.Wait(t, "the publisher dialed through Config.Dial", seen(pubEP))
		testkit.Wait(t, "the replay socket dialed through Config.Dial", seen(replay))
		if refuse && eng.subscribed() {
			t.Error("a refused dial connected the listener")
		}
		if !refuse {
			testkit.Wait(t, "the listener to subscribe", eng.subscribed)
		}
		l.Close()
	}
}
