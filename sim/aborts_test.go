package sim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

var (
	clientAborts  = testkit.Labels{LabelAbortReason: AbortReasonClient}
	engineAborts  = testkit.Labels{LabelAbortReason: AbortReasonEngine}
	successAborts = testkit.Labels{vllm.LabelFinishedReason: vllm.FinishedAbort}
)

// TestClientDisconnectAborts: a client that goes away — mid-stream, or
// while waiting for a whole answer — has its request dropped by the
// engine, whatever the API, and counted in llmgw_sim_aborted_requests_total
// {reason="client"}; vLLM's own abort count does not move (vLLM counts a
// client's abort nowhere, vllm-project/vllm#31503).
func TestClientDisconnectAborts(t *testing.T) {
	tests := []struct {
		name, path, body string
		stream           bool
	}{
		{"chat stream", "/v1/chat/completions", chatBody("hold", `,"stream":true,"max_tokens":8`), true},
		{"chat", "/v1/chat/completions", chatBody("hold", `,"max_tokens":8`), false},
		{"completion stream", "/v1/completions", `{"prompt":"hold","stream":true,"max_tokens":8}`, true},
		{"responses stream", "/v1/responses", `{"input":"hold","stream":true,"max_output_tokens":8}`, true},
		{"responses", "/v1/responses", `{"input":"hold","max_output_tokens":8}`, false},
		{"messages stream", "/v1/messages", `{"model":"llama","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hold"}]}`, true},
		{"messages", "/v1/messages", `{"model":"llama","max_tokens":8,"messages":[{"role":"user","content":"hold"}]}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DecodePerToken = time.Second // gated, never actually waited
			clock := newGateClock()
			s, ts := newTestServer(t, cfg, WithClock(clock))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+tc.path, strings.NewReader(tc.body))
			done, read := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // cancelled before the answer: the non-streamed case
				}
				defer resp.Body.Close()
				r := bufio.NewReader(resp.Body)
				for { // read the first event
					line, err := r.ReadString('\n')
					if err != nil || strings.HasPrefix(line, "data:") {
						break
					}
				}
				close(read)
				<-ctx.Done()
			}()
			testkit.Wait(t, "the request running", func() bool { return s.eng.stats().Running == 1 })
			if tc.stream {
				<-read // the stream has begun; the engine holds the second token
			}
			cancel()
			<-done
			testkit.WaitMetric(t, s.met.reg, MetricSimAbortedRequests, clientAborts, 1)
			testkit.Wait(t, "the sequence released", func() bool { return s.eng.stats().Running == 0 })
			if v := testkit.Metric(t, s.met.reg, vllm.MetricRequestSuccess, successAborts); v != 0 {
				t.Errorf("request_success_total{abort} = %v, want 0 as vLLM", v)
			}
		})
	}
}

// TestClientDisconnectAbortsSteppedEngine: the same on the GPU-timed
// engine, whose step loop drops the sequence.
func TestClientDisconnectAbortsSteppedEngine(t *testing.T) {
	cfg := testConfig()
	cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization, cfg.NumGPUBlocks = "Qwen/Qwen2.5-0.5B-Instruct", "l4", 0.6, 0
	cfg.LoadScale = 0
	s, base := serve(t, cfg, nil)
	// A whole answer first: the new APIs run on the step loop like chat.
	var m vllm.AnthropicMessagesResponse
	postOK(t, base+"/v1/messages", `{"model":"llama","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, &m)
	if m.Usage == nil || m.Usage.OutputTokens != 3 {
		t.Fatalf("answer %+v", m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/responses",
		strings.NewReader(`{"input":"a long answer","stream":true,"max_output_tokens":3000}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, vllm.EventOutputTextDelta) {
			break
		}
	}
	cancel()
	resp.Body.Close()
	testkit.WaitMetric(t, s.met.reg, MetricSimAbortedRequests, clientAborts, 1)
	testkit.Wait(t, "the sequence dropped", func() bool { st := s.eng.stats(); return st.Running == 0 && st.Waiting == 0 })
}

// TestStalledReaderAborts: a client that keeps its connection but stops
// reading fills the socket's buffers; the blocked write times out
// (--sim-stream-write-timeout) and the request is aborted.
func TestStalledReaderAborts(t *testing.T) {
	cfg := testConfig()
	cfg.StreamWriteTimeout = 100 * time.Millisecond
	s, base := serve(t, cfg, func(c net.Conn) {
		_ = c.(*net.TCPConn).SetWriteBuffer(4096) // fill up after a few kilobytes
	})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"prompt":"flood","stream":true,"max_tokens":3000}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Read nothing more: the connection stays open, the stream stalls.
	testkit.WaitMetric(t, s.met.reg, MetricSimAbortedRequests, clientAborts, 1)
	testkit.Wait(t, "the sequence released", func() bool { return s.eng.stats().Running == 0 })
	if v := testkit.Metric(t, s.met.reg, vllm.MetricGenerationTokens, nil); v >= 3000 {
		t.Errorf("%v tokens generated: the request was not cut short", v)
	}
	// The server gives the connection up too: the client, still not
	// reading, finds it closed once it drains what was buffered.
	_ = conn.SetReadDeadline(time.Now().Add(testkit.DefaultTimeout))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("the server kept the connection open: %v", err)
	}
}

// TestEngineAbortCounted: a request the engine aborts (a sleep in mode
// abort) counts as an engine abort, and in vLLM's own abort count.
func TestEngineAbortCounted(t *testing.T) {
	cfg := sleepConfig()
	cfg.DecodePerToken = time.Millisecond
	gate := newGateClock()
	s, ts := newTestServer(t, cfg, WithClock(gate))
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(t, ts.URL+"/v1/messages", `{"model":"llama","max_tokens":4,"messages":[{"role":"user","content":"in flight"}]}`)
	}()
	testkit.Wait(t, "the request running", func() bool { return s.eng.stats().Running == 1 })
	post(t, ts.URL+"/sleep?level=1", "")
	<-done
	if v := testkit.Metric(t, s.met.reg, MetricSimAbortedRequests, engineAborts); v != 1 {
		t.Errorf("engine aborts = %v, want 1", v)
	}
	if v := testkit.Metric(t, s.met.reg, vllm.MetricRequestSuccess, successAborts); v != 1 {
		t.Errorf("request_success_total{abort} = %v, want 1", v)
	}
	if v := testkit.Metric(t, s.met.reg, MetricSimAbortedRequests, clientAborts); v != 0 {
		t.Errorf("client aborts = %v, want 0", v)
	}
}

// serve runs a server on a loopback listener through Serve (the step loop
// included), each accepted connection passed to accepted first.
func serve(t *testing.T, cfg Config, accepted func(net.Conn)) (*Server, string) {
	t.Helper()
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if accepted != nil {
		ln = hookListener{ln, accepted}
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return s, "http://" + ln.Addr().String()
}

type hookListener struct {
	net.Listener
	hook func(net.Conn)
}

func (l hookListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.hook(c)
	}
	return c, err
}
