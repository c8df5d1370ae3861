package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmgw/llmgw/router/endpoint"
)

// TestDivert (design §7.9): an answer Divert claims reaches neither the
// client nor another replica, and Serve returns the engine's status and
// its error as OpenAI's; one it does not claim passes on whole, the bytes
// read to show it included; a 5xx before the last attempt is retried
// before Divert is asked.
func TestDivert(t *testing.T) {
	ctxErr := `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.","type":"BadRequestError","param":null,"code":400}`
	answer := func(code int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code); io.WriteString(w, body) }
	}
	claim := func(code int, body []byte) bool {
		return code == 429 || code == 503 || (code == 400 && strings.Contains(string(body), "maximum context length"))
	}
	tests := []struct {
		name        string
		first, next http.HandlerFunc
		wantHits    [2]int32
		wantDiv     bool
		wantCode    int
		wantMsg     string // the refusal's message, or the client's body
	}{
		{name: "a context-length 400 is claimed", first: answer(400, ctxErr), next: ok("x"),
			wantHits: [2]int32{1, 0}, wantDiv: true, wantCode: 400, wantMsg: "maximum context length is 4096"},
		{name: "a 429 is claimed", first: answer(429, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`), next: ok("x"),
			wantHits: [2]int32{1, 0}, wantDiv: true, wantCode: 429, wantMsg: "slow down"},
		{name: "another 400 passes on whole", first: answer(400, `{"error":{"message":"bad temperature"}}`), next: ok("x"),
			wantHits: [2]int32{1, 0}, wantCode: 400, wantMsg: `{"error":{"message":"bad temperature"}}`},
		{name: "a 503 is retried on a peer first", first: answer(503, "busy"), next: ok("served"),
			wantHits: [2]int32{1, 1}, wantCode: 200, wantMsg: "served"},
		{name: "a 503 from the last replica is claimed", first: answer(503, "busy"), next: answer(503, "busy too"),
			wantHits: [2]int32{1, 1}, wantDiv: true, wantCode: 503, wantMsg: "Service Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hits [2]atomic.Int32
			p, _ := newProxy(t, 3)
			rt := &route{eps: []*endpoint.Endpoint{ep("r0", engine(t, &hits[0], tt.first)), ep("r1", engine(t, &hits[1], tt.next))}}
			res, w := serve(t, p, &Request{Route: rt, Divert: claim})
			if got := [2]int32{hits[0].Load(), hits[1].Load()}; got != tt.wantHits {
				t.Errorf("engine hits %v, want %v", got, tt.wantHits)
			}
			if res.Diverted != tt.wantDiv || res.Code != tt.wantCode {
				t.Fatalf("result %+v, want diverted %v, code %d", res, tt.wantDiv, tt.wantCode)
			}
			if tt.wantDiv {
				if res.Err == nil || res.Err.Status != tt.wantCode || !strings.Contains(res.Err.Message, tt.wantMsg) || w.Body.Len() != 0 || len(rt.accepted) != 0 {
					t.Fatalf("diverted: err %v, client got %q, accepted %v", res.Err, w.Body.String(), rt.accepted)
				}
				return
			}
			if res.Err != nil || w.Code != tt.wantCode || w.Body.String() != tt.wantMsg {
				t.Fatalf("passed on: err %v, client got %d %q", res.Err, w.Code, w.Body.String())
			}
		})
	}
}
