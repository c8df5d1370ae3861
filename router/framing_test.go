package router

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	getReq     = "GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"
	postReq    = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 11\r\n\r\n{\"a\":\"b\"}\r\n"
	chunkedReq = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: 1\r\n\r\n"
	// smuggle frames its body both ways: by Content-Length, the "GET
	// /admin" is part of the body; by the chunked coding, a request of its own.
	smuggle = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: r\r\n\r\n"
)

// TestFramingFeed: requests one after another on a connection are
// followed through their bodies, whichever way they are framed, and the
// first one framed both ways is refused with its headers' last byte held
// back — however the bytes arrive.
func TestFramingFeed(t *testing.T) {
	both := "POST / HTTP/1.1\r\ncontent-length: 4\r\ntransfer-encoding: CHUNKED\r\n\r\n0\r\n\r\n"
	http10 := "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	// end is the last byte of the headers of the request at offset at.
	end := func(stream string, at int) int { return at + strings.Index(stream[at:], "\r\n\r\n") + 3 }
	tests := []struct {
		name   string
		stream string
		// bad is the refused request's headers' last byte in stream; -1: none.
		bad int
	}{
		{"get", getReq + getReq, -1},
		{"content-length bodies", postReq + postReq + getReq, -1},
		{"chunked bodies with extensions and trailers", chunkedReq + postReq + chunkedReq, -1},
		{"line ends after a POST", postReq + "\r\n" + getReq, -1},
		{"bare line feeds", "GET / HTTP/1.1\nHost: r\nContent-Length: 2\n\nhiGET / HTTP/1.1\n\n", -1},
		{"a body that looks like headers", fmt.Sprintf("POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s", len(smuggle), smuggle) + getReq, -1},
		{"folded line", "GET / HTTP/1.1\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n" + getReq, -1},
		{"both", smuggle, end(smuggle, 0)},
		{"both, lower case, chunked in capitals", both, end(both, 0)},
		{"both after two good requests", postReq + chunkedReq + smuggle, end(postReq+chunkedReq+smuggle, len(postReq+chunkedReq))},
		{"chunked on HTTP/1.0", http10, end(http10, 0)},
	}
	for _, tt := range tests {
		if tt.bad >= 0 && tt.stream[tt.bad] != '\n' {
			t.Fatalf("%s: byte %d is %q, not the headers' last", tt.name, tt.bad, tt.stream[tt.bad])
		}
		for _, size := range []int{1, 2, 3, 7, 64, 1 << 20} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, size), func(t *testing.T) {
				f := framing{maxHeader: 64 << 10}
				got := -1
				for off := 0; off < len(tt.stream); off += size {
					end := min(off+size, len(tt.stream))
					if cut, bad := f.feed([]byte(tt.stream[off:end])); bad {
						got = off + cut
						break
					}
				}
				if got != tt.bad {
					t.Fatalf("refused at %d, want %d", got, tt.bad)
				}
				if tt.bad < 0 && f.state != stHeader {
					t.Fatalf("after the stream: state %d, want the next request's headers", f.state)
				}
			})
		}
	}
}

// TestFramingStopsOnWhatTheServerRefuses: on input Go's server answers with
// an error and a closed connection, the check stops following (and never
// refuses what comes after).
func TestFramingStopsOnWhatTheServerRefuses(t *testing.T) {
	for _, s := range []string{
		"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXX",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 200) + "\r\n\r\n",
	} {
		f := framing{maxHeader: 100}
		if _, bad := f.feed([]byte(s + smuggle)); bad || f.state != stPassthrough {
			t.Errorf("%q: bad %v, state %d, want no refusal and no more following", s, bad, f.state)
		}
	}
}

// FuzzFraming: any bytes, in any split, never panic and give the same
// answer as when read at once.
func FuzzFraming(f *testing.F) {
	for _, s := range []string{getReq, postReq, chunkedReq, smuggle, chunkedReq + smuggle} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, size uint8) {
		whole := framing{maxHeader: 1 << 10}
		wantCut, wantBad := whole.feed(b)
		split := framing{maxHeader: 1 << 10}
		step := int(size) + 1
		for off := 0; off < len(b); off += step {
			end := min(off+step, len(b))
			if cut, bad := split.feed(b[off:end]); bad {
				if !wantBad || off+cut != wantCut {
					t.Fatalf("split by %d refused at %d; at once: %v at %d", step, off+cut, wantBad, wantCut)
				}
				return
			}
		}
		if wantBad {
			t.Fatalf("at once refused at %d; split by %d never", wantCut, step)
		}
	})
}

// rawExchange sends raw on a new connection to addr and returns what the
// router answered until it closed the connection (or 3 s passed: closed
// is false then).
func rawExchange(t *testing.T, addr, raw string) (answer string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	return string(b), err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// statuses are the status codes of the answers in a raw exchange.
func statuses(t *testing.T, answer string) []int {
	t.Helper()
	var out []int
	br := bufio.NewReader(strings.NewReader(answer))
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp.StatusCode)
	}
}

// TestConflictingFramingRefused: over the router's plain-text API, a
// request framed both by Content-Length and Transfer-Encoding is answered
// 400 and its connection closed, whether it comes first or after a good
// request on a kept-alive connection; the request hidden in its body is
// never served. Chunked requests alone are served and keep their
// connection.
func TestConflictingFramingRefused(t *testing.T) {
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{}`)
	}, func(*Config) {})
	for _, tt := range []struct {
		name   string
		raw    string
		want   []int
		closed bool
	}{
		{"both", smuggle, []int{400}, true},
		{"both after a good request", getReq + smuggle, []int{200, 400}, true},
		{"chunked alone, kept alive", "POST /v1/models HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + getReq, []int{405, 200}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			answer, closed := rawExchange(t, addr, tt.raw)
			got := statuses(t, answer)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || closed != tt.closed {
				t.Fatalf("answers %v, closed %v; want %v, closed %v:\n%s", got, closed, tt.want, tt.closed, answer)
			}
			if bytes.Contains([]byte(answer), []byte("/admin")) {
				t.Fatalf("the smuggled request was answered:\n%s", answer)
			}
		})
	}
}

// TestCloseChunked: over HTTPS, where the framing is not seen, a chunked
// request's answer closes its connection; any other keeps it.
func TestCloseChunked(t *testing.T) {
	h := closeChunked(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for _, tt := range []struct {
		te   []string
		want string
	}{{nil, ""}, {[]string{"chunked"}, "close"}} {
		req := httptest.NewRequest(http.MethodPost, "https://r/v1/completions", strings.NewReader("{}"))
		req.TransferEncoding = tt.te
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := w.Header().Get("Connection"); got != tt.want {
			t.Errorf("Transfer-Encoding %v: Connection %q, want %q", tt.te, got, tt.want)
		}
	}
}
