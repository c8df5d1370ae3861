package api

import (
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/openai"
)

// callers bounds the requests each caller has in flight (design §11
// "Limits"): an API key, or — while the check lets requests without a key
// through — a client address. The router's own bound (--max-inflight, a
// 503) is one pool for everyone, so without this one a single key's
// clients could take all of it: 1,100 uploads sent slowly enough held every
// slot for 18 s, and every other client got 503. A request holds its
// place from the moment its key is checked, before its body is read, so
// slow uploads count as they are sent; past the bound the caller gets a
// 429 of its own and the others never notice.
//
// Only callers with requests in flight have an entry, so the map is
// bounded by the requests the router serves at once.
type callers struct {
	max     int
	mu      sync.Mutex
	held    map[caller]int
	refused *prometheus.CounterVec
}

// caller is who a request counts against: a key's name, or the address of
// a request without a key.
type caller struct {
	key, addr string
}

// describe names c in a refusal: the key's name is the client's own, and an
// address is the one it connects from.
func (c caller) describe() string {
	if c.addr != "" {
		return "the client address " + c.addr
	}
	return "the API key " + c.key
}

func newCallers(max int, reg prometheus.Registerer) *callers {
	c := &callers{max: max, held: map[caller]int{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_caller_limited_total",
			Help: "Requests refused with 429 because their caller — an API key (key), or a client address while keys are not required (key=\"\") — had max_key_inflight requests in flight.",
		}, []string{"key"})}
	if reg != nil {
		reg.MustRegister(c.refused)
	}
	return c
}

// callerOf is who r counts against: its key when it presented one, else
// its connection's address (not a forwarded header, which the client
// writes itself).
func callerOf(r *http.Request, key *llmgwv1.ApiKey) caller {
	if key != nil {
		return caller{key: key.GetName()}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return caller{addr: host}
}

// acquire takes a place for c, or refuses when c holds max already;
// release gives it back. With no bound (max 0) both do nothing.
func (l *callers) acquire(c caller) *openai.Error {
	if l.max <= 0 {
		return nil
	}
	l.mu.Lock()
	n := l.held[c]
	if n >= l.max {
		l.mu.Unlock()
		l.refused.WithLabelValues(c.key).Inc()
		return openai.CallerBusy(c.describe(), l.max, 1)
	}
	l.held[c] = n + 1
	l.mu.Unlock()
	return nil
}

func (l *callers) release(c caller) {
	if l.max <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.held[c]; n > 1 {
		l.held[c] = n - 1
	} else {
		delete(l.held, c)
	}
}
