package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// The caller-cap test's router: room for 100 requests at once, 30 of them
// for any one key.
const (
	capMaxInflight    = 100
	capMaxKeyInflight = 30
	capSlowUploads    = 200
)

// slowUploader holds uploads that never finish: each sends a chat's
// headers and a few bytes of its body, then a byte a second.
type slowUploader struct {
	refused  atomic.Int64 // answered 429
	answered sync.Map     // other statuses: status → count (*atomic.Int64)
	wg       sync.WaitGroup
	stop     chan struct{}
}

// startSlowUploads opens n uploads for key to addr, from 127.0.0.2 to
// 127.0.0.11 in turn (so that no per-address bound is what stops them).
func startSlowUploads(t *testing.T, addr, key string, n int) *slowUploader {
	t.Helper()
	u := &slowUploader{stop: make(chan struct{})}
	t.Cleanup(u.close)
	for i := range n {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%10))}
		u.wg.Go(func() { u.upload(addr, key, local) })
	}
	return u
}

func (u *slowUploader) close() {
	select {
	case <-u.stop:
	default:
		close(u.stop)
	}
	u.wg.Wait()
}

func (u *slowUploader) upload(addr, key string, local *net.TCPAddr) {
	d := net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		u.count(-1)
		return
	}
	defer c.Close()
	const length = 4096
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"demo\",", key, length); err != nil {
		u.count(-1)
		return
	}
	// An answer before the body is whole is a refusal; the reader reports
	// it, or the connection's end when the test closes it.
	status := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case code := <-status:
			if code != 0 {
				u.count(code)
			}
			return
		case <-u.stop:
			_ = c.Close()
			<-status
			return
		case <-tick.C:
			_, _ = c.Write([]byte(" ")) // JSON allows the whitespace
		}
	}
}

func (u *slowUploader) count(code int) {
	if code == http.StatusTooManyRequests {
		u.refused.Add(1)
		return
	}
	n, _ := u.answered.LoadOrStore(code, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

func (u *slowUploader) others() map[int]int64 {
	out := map[int]int64{}
	u.answered.Range(func(k, v any) bool { out[k.(int)] = v.(*atomic.Int64).Load(); return true })
	return out
}

// TestOpsCallerCap (issue 26 part 3, the router's per-key in-flight cap):
// one key opens 200 uploads that never finish — against a router serving
// at most 100 requests at once, which without the cap they fill (every
// other client then gets 503) — and another key's chats, sent meanwhile
// from another address, all succeed (their p99 stated); the first key's
// uploads past its 30 get 429 at once, counted on the operations port.
func TestOpsCallerCap(t *testing.T) {
	d := startDev(t)
	greedy := createKey(t, d.grpc, "greedy")
	patient := createKey(t, d.grpc, "patient")
	r := startRouterWith(t, "rcap", []string{d.grpc}, "--max-inflight", fmt.Sprint(capMaxInflight),
		"--max-key-inflight", fmt.Sprint(capMaxKeyInflight))
	if !eventually(60*time.Second, func() bool { code, _ := chatAs(r.http, "demo", patient); return code == http.StatusOK }) {
		code, body := chatAs(r.http, "demo", patient)
		t.Fatalf("the router does not serve the patient key within %v: %d %s\n%s", within(60*time.Second), code, body, tail(r.output(), 20))
	}

	up := startSlowUploads(t, r.http, greedy, capSlowUploads)
	// The uploads have taken what they can once the key's bound is in
	// flight (without the bound: the router's whole room).
	if !eventually(30*time.Second, func() bool {
		n, _ := testkit.Scrape(r.ops, "llmgw_router_inflight", nil)
		return n >= capMaxKeyInflight
	}) {
		n, _ := testkit.Scrape(r.ops, "llmgw_router_inflight", nil)
		t.Fatalf("%v of the greedy key's uploads in flight within %v, want %d", n, within(30*time.Second), capMaxKeyInflight)
	}

	// Meanwhile the patient key, from 127.0.0.1, 40 chats four at a time.
	var (
		mu    sync.Mutex
		took  []time.Duration
		fails []string
		wg    sync.WaitGroup
	)
	next := make(chan int, 40)
	for i := range 40 {
		next <- i
	}
	close(next)
	for range 4 {
		wg.Go(func() {
			for range next {
				start := time.Now()
				code, body := chatAs(r.http, "demo", patient)
				mu.Lock()
				took = append(took, time.Since(start))
				if code != http.StatusOK {
					fails = append(fails, fmt.Sprintf("%d %.200s", code, body))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(took)
	p99 := took[len(took)*99/100]
	t.Logf("patient key: %d chats beside %d stalled uploads of another key, p50 %v p99 %v; greedy key: %d refused with 429, other answers %v",
		len(took), capSlowUploads, took[len(took)/2].Round(time.Millisecond), p99.Round(time.Millisecond), up.refused.Load(), up.others())
	if len(fails) > 0 {
		t.Fatalf("%d of %d chats of the patient key failed beside the greedy key's uploads: %v", len(fails), len(took), fails)
	}
	if !eventually(10*time.Second, func() bool { return up.refused.Load() == capSlowUploads-capMaxKeyInflight }) {
		t.Errorf("%d of the greedy key's %d uploads refused with 429, want %d (those past its %d)",
			up.refused.Load(), capSlowUploads, capSlowUploads-capMaxKeyInflight, capMaxKeyInflight)
	}
	if limit := within(5 * time.Second); p99 > limit {
		t.Errorf("patient key p99 %v, want under %v", p99, limit)
	}
	if others := up.others(); len(others) > 0 {
		t.Errorf("the greedy key's uploads got answers other than 429: %v (-1: could not connect)", others)
	}
	// The refusals are counted, by key, on the operations port.
	if n, ok := testkit.Scrape(r.ops, "llmgw_router_caller_limited_total", testkit.Labels{"key": "greedy"}); !ok || n < capSlowUploads-capMaxKeyInflight {
		t.Errorf("llmgw_router_caller_limited_total{key=greedy} = %v (%v), want at least %d", n, ok, capSlowUploads-capMaxKeyInflight)
	}

	// Once the uploads end, their places are given back.
	up.close()
	if !eventually(20*time.Second, func() bool { code, _ := chatAs(r.http, "demo", greedy); return code == http.StatusOK }) {
		t.Fatalf("the greedy key is still refused %v after its uploads ended", within(20*time.Second))
	}
}
