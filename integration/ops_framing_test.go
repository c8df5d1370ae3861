package integration

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOpsConflictingFraming (issue 26, item 7): a request to a router
// process framed both by Content-Length and Transfer-Encoding: chunked,
// after a good request on the same kept-alive connection, is answered 400
// and the connection closed; the request its chunked body hid is never
// served. (Go's server alone serves both and keeps the connection.)
func TestOpsConflictingFraming(t *testing.T) {
	addr := freeAddr(t)
	r := llmgwProcess(t, "router", routerArgs(t, addr)...)
	r.start()
	if !eventually(20*time.Second, func() bool { return healthy(addr) }) {
		t.Fatalf("the router did not answer /healthz within %v:\n%s", within(20*time.Second), tail(r.output(), 20))
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// By Content-Length the second request's body holds "GET /hidden"; by
	// the chunked coding, that is a request of its own.
	const hidden = "GET /hidden HTTP/1.1\r\nHost: r\r\n\r\n"
	smuggled := "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n" +
		"Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n"+smuggled); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(within(10 * time.Second)))
	br := bufio.NewReader(c)
	var codes []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("answers %v, then the connection stayed open", codes)
			}
			break // closed
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "/hidden") {
			t.Fatalf("the hidden request was served: %s", body)
		}
		codes = append(codes, resp.StatusCode)
	}
	if len(codes) != 2 || codes[0] != http.StatusOK || codes[1] != http.StatusBadRequest {
		t.Fatalf("answers %v, want [200 400] and the connection closed", codes)
	}
}
