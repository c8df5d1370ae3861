package replicas

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeResolver answers from a table; a name it does not hold fails, so no
// test ever asks a real DNS server.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	asked   []string
}

func (f *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, network+" "+host)
	a, ok := f.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return a, nil
}

// fakeDial records the addresses it is asked for and connects none: no
// test of the guard leaves the process.
type fakeDial struct {
	mu     sync.Mutex
	dialed []string
	fail   map[string]bool
}

func (f *fakeDial) dial(_ context.Context, _, addr string) (net.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dialed = append(f.dialed, addr)
	if f.fail[addr] {
		return nil, errors.New("connection refused (fake)")
	}
	c, s := net.Pipe()
	s.Close()
	return c, nil
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestEndpointGuard: the agent resolves an external engine's host each
// time it connects and refuses an address the model policy refuses — the
// one fsm applies to endpoints as written — unless the model allows
// link-local endpoints (issue 26: a name checked at apply could resolve
// elsewhere later). It connects to the addresses it checked, never to the
// name.
func TestEndpointGuard(t *testing.T) {
	res := &fakeResolver{answers: map[string][]netip.Addr{
		"engine.invalid":     addrs("127.0.0.1"),
		"two.invalid":        addrs("127.0.0.2", "127.0.0.3"),
		"rebound.invalid":    addrs("169.254.169.254"),
		"mixed.invalid":      addrs("127.0.0.1", "169.254.10.1"),
		"v6meta.invalid":     addrs("fe80::a9fe:a9fe"),
		"ec2v6.invalid":      addrs("fd00:ec2::254"),
		"mapped.invalid":     addrs("::ffff:169.254.169.254"),
		"alibaba.invalid":    addrs("100.100.100.200"),
		"empty.invalid":      nil,
		"first-down.invalid": addrs("127.0.0.4", "127.0.0.5"),
	}}
	tests := []struct {
		name   string
		addr   string
		allow  bool
		dialed []string // what the guard connects to, in order
		err    string   // substring; "" = connects
		refuse bool     // the error is ErrEndpointRefused
	}{
		{"a name resolving to loopback", "engine.invalid:8000", false, []string{"127.0.0.1:8000"}, "", false},
		{"each address in turn", "first-down.invalid:8000", false, []string{"127.0.0.4:8000", "127.0.0.5:8000"}, "", false},
		{"the first address that answers", "two.invalid:8000", false, []string{"127.0.0.2:8000"}, "", false},
		{"an address literal", "127.0.0.9:8000", false, []string{"127.0.0.9:8000"}, "", false},
		{"a name rebound to the metadata service", "rebound.invalid:80", false, nil, `host "rebound.invalid" resolves to 169.254.169.254, a link-local address`, true},
		{"one bad address refuses the answer", "mixed.invalid:80", false, nil, "resolves to 169.254.10.1", true},
		{"IPv6 link-local metadata", "v6meta.invalid:80", false, nil, "resolves to fe80::a9fe:a9fe", true},
		{"EC2's IPv6 metadata", "ec2v6.invalid:80", false, nil, "the EC2 metadata service", true},
		{"an IPv4-mapped link-local address", "mapped.invalid:80", false, nil, "link-local", true},
		{"Alibaba's metadata", "alibaba.invalid:80", false, nil, "Alibaba", true},
		{"a link-local literal stored before the policy", "169.254.169.254:80", false, nil, "link-local", true},
		{"a metadata name, not resolved", "metadata.google.internal:80", false, nil, "GCE metadata", true},
		{"allowed by the model", "rebound.invalid:80", true, []string{"169.254.169.254:80"}, "", false},
		{"a name that does not resolve", "nowhere.invalid:80", false, nil, "no such host", false},
		{"an empty answer", "empty.invalid:80", false, nil, "no address", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := &fakeDial{fail: map[string]bool{"127.0.0.4:8000": true}}
			var logs bytes.Buffer
			rs, err := New(Config{Resolver: res, Dial: fd.dial}, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			g := rs.newGuard(&llmgwv1.Replica{Id: "ext-0", Model: "ext"},
				&llmgwv1.Model{Name: "ext", Engine: "external", AllowLinkLocalEndpoints: tt.allow})
			c, err := g.DialContext(context.Background(), "tcp", tt.addr)
			if c != nil {
				c.Close()
			}
			if !slices.Equal(fd.dialed, tt.dialed) {
				t.Errorf("dialed %q, want %q", fd.dialed, tt.dialed)
			}
			if tt.err == "" {
				if err != nil {
					t.Fatalf("DialContext: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) || errors.Is(err, ErrEndpointRefused) != tt.refuse {
				t.Fatalf("err = %v, want %q (refused: %v)", err, tt.err, tt.refuse)
			}
			if tt.refuse && !strings.Contains(logs.String(), "connection to an external engine refused") {
				t.Errorf("refusal not logged: %s", logs.String())
			}
		})
	}
}

// TestEndpointGuardLogsOnce: a refusal repeated at every probe is counted
// each time and logged once, again after the endpoint has connected.
func TestEndpointGuardLogsOnce(t *testing.T) {
	res := &fakeResolver{answers: map[string][]netip.Addr{"e.invalid": addrs("169.254.169.254")}}
	fd := &fakeDial{}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	rs, err := New(Config{Resolver: res, Dial: fd.dial}, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	g := rs.newGuard(&llmgwv1.Replica{Id: "ext-0", Model: "ext"}, &llmgwv1.Model{Name: "ext", Engine: "external"})
	dial := func() error {
		c, err := g.DialContext(context.Background(), "tcp", "e.invalid:80")
		if c != nil {
			c.Close()
		}
		return err
	}
	for range 3 {
		if err := dial(); !errors.Is(err, ErrEndpointRefused) {
			t.Fatalf("err = %v", err)
		}
	}
	res.mu.Lock()
	res.answers["e.invalid"] = addrs("127.0.0.1")
	res.mu.Unlock()
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	res.mu.Lock()
	res.answers["e.invalid"] = addrs("169.254.169.254")
	res.mu.Unlock()
	if err := dial(); !errors.Is(err, ErrEndpointRefused) {
		t.Fatalf("err = %v", err)
	}
	if n := strings.Count(logs.String(), "connection to an external engine refused"); n != 2 {
		t.Errorf("%d refusal log lines, want 2:\n%s", n, logs.String())
	}
	if n := testkit.Metric(t, reg, "llmgw_agent_external_refused_dials_total", nil); n != 4 {
		t.Errorf("llmgw_agent_external_refused_dials_total = %v, want 4", n)
	}
	if !slices.Equal(fd.dialed, []string{"127.0.0.1:80"}) {
		t.Errorf("dialed %q, want only the loopback answer", fd.dialed)
	}
}

// TestDialEngine: the load reader reaches an external replica's engine
// through its guard (the strictest, when two models name one engine) and
// an engine llmgw runs directly.
func TestDialEngine(t *testing.T) {
	res := &fakeResolver{answers: map[string][]netip.Addr{"e.invalid": addrs("169.254.169.254")}}
	fd := &fakeDial{}
	rs, err := New(Config{Resolver: res, Dial: fd.dial}, nil, nil, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, allow := range []bool{true, false} {
		r := &runner{replica: &llmgwv1.Replica{Id: "ext-" + map[bool]string{true: "a", false: "b"}[allow]},
			model: &llmgwv1.Model{Engine: "external", AllowLinkLocalEndpoints: allow}}
		r.guard = rs.newGuard(r.replica, r.model)
		r.launch.Address = "e.invalid:80"
		rs.running[r.replica.Id] = r
	}
	if _, err := rs.DialEngine(context.Background(), "tcp", "e.invalid:80"); !errors.Is(err, ErrEndpointRefused) {
		t.Fatalf("DialEngine to a rebound external engine: %v", err)
	}
	if guarded := rs.guardAt("127.0.0.1:1"); guarded != nil {
		t.Fatal("an engine llmgw runs is dialed through a guard")
	}
	if len(fd.dialed) != 0 {
		t.Errorf("dialed %q", fd.dialed)
	}
}
