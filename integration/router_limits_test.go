package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// The router's limits of issue #12 (design §11 "Limits", docs/operations.md
// "Router limits") against a real `llmgw router` process: a slow body is
// cut at --body-timeout while other requests are served, a connection past
// --max-connections takes the oldest idle one's slot, or is closed at once
// when every slot serves a request (issue 26), oversized headers get 431,
// and requests past --max-inflight get 503 at once. router/limits_test.go
// and router/conns_test.go cover the same in-process; this shows the flags
// reach the running server.

// Small limits, so the test sees them in seconds.
const (
	rlBodyTimeout = time.Second
	rlMaxConns    = 8
	rlMaxInflight = 2
)

// applySlowModel applies a sim model of one replica decoding at 5 ms a
// token: a 4-token chat takes some 20 ms, a 1500-token stream some 7 s,
// long enough to hold an in-flight slot for the whole check.
func applySlowModel(t *testing.T, addr, name string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".yaml")
	writeFile(t, file, fmt.Sprintf("name: %s\nengine: sim\nmodel: org/%s\nreplicas: 1\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"5\"]\n", name, name))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(addr, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply %s: %v", name, err)
	}
}

// rawConn is one client connection written to byte by byte, so the test
// decides what the router gets and when: half a body, 101 headers, a
// request on the 9th connection.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, within(5*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// send writes raw bytes with a deadline; a write the router cut short is
// reported, not fatal, since its answer may still be readable.
func (r *rawConn) send(b string) error {
	_ = r.c.SetWriteDeadline(time.Now().Add(within(5 * time.Second)))
	_, err := io.WriteString(r.c, b)
	return err
}

// answer reads one response within d, with its body (up to 64 KiB).
func (r *rawConn) answer(d time.Duration) (*http.Response, string, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(d))
	defer r.c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp, string(b), err
}

// do sends a request and reads its answer within(10s), failing the test
// if there is none.
func (r *rawConn) do(req string) (*http.Response, string) {
	r.t.Helper()
	if err := r.send(req); err != nil {
		r.t.Fatalf("send: %v", err)
	}
	resp, body, err := r.answer(within(10 * time.Second))
	if err != nil {
		r.t.Fatalf("no answer within %v: %v", within(10*time.Second), err)
	}
	return resp, body
}

// chatBody is a 4-token chat for model.
func chatBody(model string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"ping"}],"max_tokens":4}`, model)
}

// chatRequest is a keep-alive POST of a 4-token chat, with extra header
// lines (each ending in CRLF) before the blank line.
func chatRequest(model, extra string) string {
	body := chatBody(model)
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n", len(body)) + extra + "\r\n" + body
}

// openAIError decodes an OpenAI error body; ok is false if it is not one.
func openAIError(body string) (typ, code string, ok bool) {
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == "" {
		return "", "", false
	}
	return e.Error.Type, e.Error.Code, true
}

func TestRouterLimits(t *testing.T) {
	s := newServer(t, "c1", serverOpts{extra: []string{"--bootstrap"}})
	s.start()
	c := &cluster{t: t, servers: []*controlServer{s}}
	c.waitLeader(c.servers, formTimeout)
	startAgentProc(t, "n1", []string{s.grpc})
	// r1 has the time, header and connection limits; r2 the in-flight
	// limit, so its slots are not taken by r1's checks. Headers keep their
	// defaults (65536 bytes, 100 fields).
	r1 := startRouterWith(t, "r1", []string{s.grpc}, "--body-timeout", rlBodyTimeout.String(),
		"--max-connections", fmt.Sprint(rlMaxConns))
	r2 := startRouterWith(t, "r2", []string{s.grpc}, "--max-inflight", fmt.Sprint(rlMaxInflight))
	applySlowModel(t, s.grpc, "chat")
	waitServing(t, s.grpc, "chat", 1, r1, r2)
	// waitServing's keep-alive connections would hold r1's connection
	// slots; each subtest closes what it leaves.
	chatClient.CloseIdleConnections()

	t.Run("slow body is cut at --body-timeout", func(t *testing.T) {
		defer chatClient.CloseIdleConnections()
		// Without the body timeout nothing bounds the body's read (Go's
		// server lifts the header deadline once the headers are in, and
		// the router sets no ReadTimeout): with --body-timeout 60s, the
		// default, the read below gets no answer within its 10 s.
		slow := dialRaw(t, r1.http)
		body := chatBody("chat")
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
		start := time.Now() // before the write: the router's deadline starts after it
		if err := slow.send(head + body[:len(body)/2]); err != nil {
			t.Fatalf("send: %v", err)
		}
		// Meanwhile another connection is served as usual.
		chatStart := time.Now()
		if code, b := chat(r1.http, "chat"); code != http.StatusOK {
			t.Fatalf("chat on another connection while a body stalls: %d %s", code, b)
		}
		chatTook := time.Since(chatStart)
		wait := within(10 * time.Second)
		resp, b, err := slow.answer(wait)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("stalled body: no answer within %v of sending half of it: %v", wait, err)
		}
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("stalled body: %d %s, want 408", resp.StatusCode, b)
		}
		if _, code, ok := openAIError(b); !ok || code != "request_timeout" {
			t.Errorf("408 body %q is not OpenAI's error with code request_timeout", b)
		}
		if took < rlBodyTimeout {
			t.Errorf("cut after %v, before --body-timeout %v", took, rlBodyTimeout)
		}
		// The rest of the body never came: the router hangs up, with a
		// half-close (EOF here), not a reset that could lose the 408.
		_ = slow.c.SetReadDeadline(time.Now().Add(within(5 * time.Second)))
		if _, err = slow.br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("after the 408, reading the connection: %v, want EOF", err)
		}
		t.Logf("half a body (%d of 4096 bytes) answered 408 after %v (--body-timeout %v); a chat on another connection meanwhile: 200 in %v",
			len(body)/2, took.Round(time.Millisecond), rlBodyTimeout, chatTook.Round(time.Millisecond))
	})

	t.Run("connections past --max-connections", func(t *testing.T) {
		// Fill the cap, each connection served once (a health check) so it
		// is idle in keep-alive.
		conns := make([]*rawConn, rlMaxConns)
		for i := range conns {
			conns[i] = dialRaw(t, r1.http)
			resp, b := conns[i].do("GET /healthz HTTP/1.1\r\nHost: router\r\n\r\n")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("connection %d of %d: /healthz %d %s", i+1, rlMaxConns, resp.StatusCode, b)
			}
		}
		// One more is served at once: the oldest idle connection is closed
		// to make room (issue 26). Before, it waited in the kernel's
		// backlog until a client closed one.
		extra := dialRaw(t, r1.http)
		if resp, b := extra.do(chatRequest("chat", "")); resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d past the cap of %d, with idle ones: %d %s", rlMaxConns+1, rlMaxConns, resp.StatusCode, b)
		}
		_ = conns[0].c.SetReadDeadline(time.Now().Add(within(5 * time.Second)))
		if _, err := conns[0].br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the oldest idle connection was not closed to make room: %v", err)
		}
		// With every connection serving a stream, one more is closed at
		// once, while the streams go on.
		busy := append(conns[1:], extra)
		stream := `{"model":"chat","messages":[{"role":"user","content":"hold"}],"max_tokens":1500,"stream":true}`
		for i, c := range busy {
			req := "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n" +
				fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(stream), stream)
			if err := c.send(req); err != nil {
				t.Fatalf("stream %d: %v", i+1, err)
			}
			_ = c.c.SetReadDeadline(time.Now().Add(within(10 * time.Second)))
			if _, err := c.br.Peek(1); err != nil {
				t.Fatalf("stream %d: no answer: %v", i+1, err)
			}
		}
		// Closed with a reset: the dial itself may see it.
		start := time.Now()
		if refused, err := net.DialTimeout("tcp", r1.http, within(5*time.Second)); err == nil {
			defer refused.Close()
			_ = refused.SetReadDeadline(time.Now().Add(within(5 * time.Second)))
			if _, err := refused.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection %d with %d streams in flight was not closed: %v", rlMaxConns+1, rlMaxConns, err)
			}
		}
		closedIn := time.Since(start)
		for i, c := range busy {
			if _, err := c.br.ReadByte(); err != nil {
				t.Fatalf("stream %d after the refusal: %v", i+1, err)
			}
			c.c.Close()
		}
		t.Logf("%d idle connections held; the %dth served at once, the oldest idle closed; with %d streams, the next closed in %v",
			rlMaxConns, rlMaxConns+1, rlMaxConns, closedIn.Round(time.Millisecond))
		// The next subtests need slots: the router must have seen the
		// streams' clients go (a loaded machine takes its time), or their
		// first connection is the one past the cap, closed at once.
		if !eventually(30*time.Second, func() bool {
			v, ok := testkit.Scrape(r1.ops, "llmgw_router_connections_open", testkit.Labels{"listener": "api"})
			return ok && v == 0
		}) {
			v, _ := testkit.Scrape(r1.ops, "llmgw_router_connections_open", testkit.Labels{"listener": "api"})
			t.Fatalf("the router still holds %v API connections after their clients closed them", v)
		}
	})

	t.Run("headers", func(t *testing.T) {
		// pad returns header lines X-Pad-1.. that the router counts (name,
		// ": ", value, CRLF) as exactly size bytes in n fields.
		pad := func(n, size int) string {
			var b strings.Builder
			for i := 1; i < n; i++ {
				line := fmt.Sprintf("X-Pad-%d: x\r\n", i)
				b.WriteString(line)
				size -= len(line)
			}
			name := fmt.Sprintf("X-Pad-%d", n)
			b.WriteString(name + ": " + strings.Repeat("x", size-len(name)-4) + "\r\n")
			return b.String()
		}
		// What chatRequest puts in r.Header besides the pads (Host is not
		// a header to Go's server): Content-Type and Content-Length.
		body := chatBody("chat")
		base := len("Content-Type: application/json\r\n") + len(fmt.Sprintf("Content-Length: %d\r\n", len(body)))
		const maxBytes, maxCount = 65536, 100 // the defaults
		tests := []struct {
			name  string
			extra string
			want  int
			// openAI: the router's own 431 with OpenAI's error body; else
			// Go's server answers in plain text before the router sees it.
			openAI bool
		}{
			// Without --max-header-count Go takes any count: 200.
			{"101 small fields", pad(maxCount+1-2, (maxCount+1-2)*20), http.StatusRequestHeaderFieldsTooLarge, true},
			{"100 fields, 65536 bytes: at both limits", pad(maxCount-2, maxBytes-base), http.StatusOK, false},
			// Inside Go's 4 KiB of slack: only the router's count refuses it.
			{"65537 bytes", pad(1, maxBytes+1-base), http.StatusRequestHeaderFieldsTooLarge, true},
			// Past Go's MaxHeaderBytes + 4 KiB; with Go's default of 1 MiB
			// (no --max-header-bytes) it would be 200.
			{"one field of 70 KiB", pad(1, 70<<10), http.StatusRequestHeaderFieldsTooLarge, false},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := dialRaw(t, r1.http)
				defer c.c.Close()
				req := chatRequest("chat", tt.extra)
				// The router may answer before reading all of a request it
				// refuses; the answer is what counts.
				werr := c.send(req)
				resp, b, err := c.answer(within(10 * time.Second))
				if err != nil {
					t.Fatalf("no answer within %v (write: %v): %v", within(10*time.Second), werr, err)
				}
				if resp.StatusCode != tt.want {
					t.Fatalf("%d %.200s, want %d", resp.StatusCode, b, tt.want)
				}
				typ, code, isOpenAI := openAIError(b)
				switch {
				case tt.want == http.StatusOK:
				case tt.openAI && (!isOpenAI || code != "headers_too_large"):
					t.Errorf("body %.200q (type %q code %q), want OpenAI's error with code headers_too_large", b, typ, code)
				case !tt.openAI && b != "431 Request Header Fields Too Large":
					t.Errorf("body %.200q, want Go's plain 431 Request Header Fields Too Large", b)
				}
				t.Logf("%d bytes of request head: %d %s", len(req)-len(body), resp.StatusCode, strings.TrimSpace(fmt.Sprintf("%.120s", b)))
			})
		}
	})

	t.Run("requests past --max-inflight get 503", func(t *testing.T) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr, Timeout: within(30 * time.Second)}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Fill r2's slots with streams of 1500 tokens (some 7 s): once their
		// 200 has come they are being served, and stay so until closed.
		stream := `{"model":"chat","messages":[{"role":"user","content":"hold"}],"max_tokens":1500,"stream":true}`
		var held []*http.Response
		defer func() {
			for _, r := range held {
				r.Body.Close()
			}
		}()
		for i := range rlMaxInflight {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r2.http+"/v1/chat/completions", strings.NewReader(stream))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("stream %d: %v", i+1, err)
			}
			held = append(held, resp)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
				t.Fatalf("stream %d: %d %s", i+1, resp.StatusCode, b)
			}
		}
		// One more is refused at once. Without --max-inflight (1024 by
		// default) it would be 200.
		start := time.Now()
		resp, err := client.Post("http://"+r2.http+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("chat")))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		refusedIn := time.Since(start)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d with %d in flight: %d %s, want 503", rlMaxInflight+1, rlMaxInflight, resp.StatusCode, b)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if _, code, ok := openAIError(string(b)); !ok || code != "router_overloaded" {
			t.Errorf("503 body %q is not OpenAI's error with code router_overloaded", b)
		}
		// Health is not counted: a load balancer still sees the router.
		if !healthy(r2.http) {
			t.Errorf("/healthz is not 200 while the in-flight limit is reached")
		}
		// The streams go on while the extra request is refused.
		if _, err := held[0].Body.Read(make([]byte, 1)); err != nil {
			t.Errorf("a held stream after the refusal: %v", err)
		}
		// Closing one stream frees its slot.
		held[0].Body.Close()
		var code int
		if !eventually(10*time.Second, func() bool { code, _ = chat(r2.http, "chat"); return code == http.StatusOK }) {
			t.Fatalf("after closing a stream, a chat still gets %d within %v", code, within(10*time.Second))
		}
		chatClient.CloseIdleConnections()
		t.Logf("with %d streams in flight, request %d: 503 Retry-After %s in %v; 200 again once a stream closed",
			rlMaxInflight, rlMaxInflight+1, resp.Header.Get("Retry-After"), refusedIn.Round(time.Millisecond))
	})
}
