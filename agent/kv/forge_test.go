package kv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// forgerEnv names the endpoint a re-executed test binary forges KV events
// on (TestMain): the attacker of issue 27, a local process of another user.
const forgerEnv = "LLMGW_KV_FORGE"

// forgedUID is who the forger runs as: nobody.
const forgedUID = 65534

// forge connects a PUB socket to ep and publishes floodBlocks forged
// blocks in the engine's topic, from seq 0 (where a fresh mirror starts),
// then exits 0; 3 if it could not connect. The agent's side is the test.
func forge(ep string) int {
	pub := zmq4.NewPub(context.Background(), zmq4.WithDialerMaxRetries(0))
	defer pub.Close()
	if err := pub.Dial(ep); err != nil {
		fmt.Fprintln(os.Stderr, "forger:", err)
		return 3
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(pub.(zmq4.Topics).Topics()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // a separate process: no harness to wait with
	}
	seq := uint64(0)
	for first := uint64(1 << 40); first < 1<<40+floodBlocks; first += floodBatch {
		if err := pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames("kv", seq, floodPayload(first, floodBatch))...)); err != nil {
			fmt.Fprintln(os.Stderr, "forger:", err)
			return 0 // the agent hung up: as good as refused
		}
		seq++
	}
	return 0
}

// runForger runs this test binary as the forger, as uid forgedUID, against
// ep, and returns its exit code. The binary is copied where that user can
// run it (go test's build directory is its builder's alone).
func runForger(t *testing.T, ep string) int {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kvforger")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "forger")
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(out.Close(), os.Chmod(dir, 0o755)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{forgerEnv + "=" + ep}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: forgedUID, Gid: forgedUID}}
	b, err := cmd.CombinedOutput()
	t.Logf("forger on %s: %v %s", ep, err, strings.TrimSpace(string(b)))
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// TestForgedPublisherCannotFeedTheMirror is issue 27's attack: a process
// of another user on the node connects to the agent's KV endpoint and
// publishes 5 M forged blocks. The agent's endpoint for an engine it runs
// is an ipc path in its own mode-0700 directory (the forger cannot even
// connect), or, the fallback, loopback TCP whose peers must run as the
// agent's user (the forger is cut off before zmq4 reads a frame). Either
// way the mirror is the real engine's, the agent's heap does not grow with
// the flood, and the engine's own events keep flowing.
func TestForgedPublisherCannotFeedTheMirror(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the forger as another user")
	}
	for _, transport := range []string{"ipc", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			h := startManaged(t, transport)
			a, ev := h.eng.stored(nil, toks(1, 4*testBS))
			h.eng.publish(false, ev)
			h.converged(t)

			base := heapLive()
			stop := heapPeak()
			ep := h.l.Endpoint()
			code := runForger(t, ep)
			peak := stop()
			live := heapLive()
			t.Logf("forger exit %d; agent heap in use peaked %d MiB over the base, live %+d MiB", code, int64(peak-base)>>20, (int64(live)-int64(base))>>20)
			if transport == "ipc" && code != 3 {
				t.Errorf("the forger connected to the agent's ipc endpoint (exit %d)", code)
			}
			if transport == "tcp" {
				testkit.Wait(t, "the forger's connection to be refused", func() bool { return value(h.hub.metrics.framesRefused) >= 1 })
			}
			if live > base+16<<20 || peak > base+64<<20 {
				t.Errorf("heap grew during the forgery: peak +%d MiB, live +%d MiB", (peak-base)>>20, (live-base)>>20)
			}
			if v := value(h.hub.metrics.overCap); v != 0 {
				t.Errorf("over capacity %v times: forged blocks reached the mirror", v)
			}
			h.converged(t) // the mirror is the engine's
			// The engine's own events keep flowing.
			_, ev = h.eng.stored(&a[3], toks(900, 2*testBS))
			h.eng.publish(false, ev)
			h.converged(t)
		})
	}
}

// startManaged starts a listener as the agent does for an engine it runs
// (design §6 "KV events"): over ipc, the engine's sockets in a socket
// directory (SocketDir, IPCEndpoints), which it binds; over tcp, the
// listener binds loopback and the engine connects. Both with SameUser.
func startManaged(t *testing.T, transport string) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	hub, err := NewHub(quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Topic, cfg.BlockSize, cfg.SameUser = "demo-0", 7, "kv", testBS, true
	cfg.Endpoint, cfg.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	if transport == "ipc" {
		// Under a directory anyone may enter, so that only SocketDir's
		// mode keeps the forger out.
		parent, err := os.MkdirTemp("", "kvsock")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(parent) })
		if err := os.Chmod(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(parent, "kv")
		if err := SocketDir(dir); err != nil {
			t.Fatal(err)
		}
		if cfg.Endpoint, cfg.ReplayEndpoint, err = IPCEndpoints(dir, cfg.ReplicaID); err != nil {
			t.Fatal(err)
		}
	}
	eng, replay := newFakeEngineOn(t, cfg.ReplayEndpoint, 1000, vllm.EncodingMap, true, false)
	cfg.ReplayEndpoint = replay
	if transport == "ipc" {
		_ = eng.pub.Close() // its connecting PUB: vLLM binds an ipc endpoint
		eng.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
		if err := eng.pub.Listen(cfg.Endpoint); err != nil {
			t.Fatal(err)
		}
	}
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	l.Engine(1)
	if transport == "ipc" {
		testkit.Wait(t, "the listener to connect and subscribe", func() bool { return slices.Contains(eng.pub.(zmq4.Topics).Topics(), "kv") })
	} else {
		eng.connect(l.Endpoint())
	}
	return &harness{hub: hub, reg: reg, l: l, eng: eng}
}
