package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/internal/hostcheck"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// External engines (design §6): a replica of engine "external" placed on
// this node is one this agent owns, not one it runs. The supervisor probes
// the endpoint (/health, then /v1/models for the model's name) and reports
// READY or UNHEALTHY with the endpoint as address; the load reader reads
// the engine's /metrics like any vLLM's (LoadTargets); and for a kv_events
// model the KV listener connects to the engine's own publisher and replay
// sockets, named in the model, instead of binding sockets for the engine
// to connect to. Nothing is started, stopped, adopted or drained: when the
// owner goes away the control plane gives the replica to another agent
// (design §5.5), and the engine never notices.

// connectKV starts the KV listener of an external replica (design §6
// "External engines"): it connects to the engine's publisher and replay
// sockets, the model's kv_events_publishers and kv_events_replay entries
// at the index of the replica's endpoint, each connection through the
// replica's endpoint guard; or, for engines whose publisher connects out,
// it binds the model's kv_events_listen entry, open only to the
// kv_events_allow addresses (by default, those the endpoint's host
// resolves to). Either way the engine's stream must show itself within
// kvStreamTimeout, or the replica is untrusted, saying why. Like listenKV
// it returns nil, logged, when it cannot: routers then use tier 1 for the
// replica.
func (rs *Set) connectKV(r *runner) *kv.Listener {
	rep, model := r.replica, r.model
	i := slices.Index(model.GetEndpoints(), rep.GetEndpoint())
	listen := len(model.GetKvEventsListen()) > 0
	if i < 0 || (!listen && i >= len(model.GetKvEventsPublishers())) || (listen && i >= len(model.GetKvEventsListen())) {
		rs.log.Warn("kv_events model without a publisher for this endpoint; routers use tier 1 for it",
			"replica", rep.GetId(), "model", rep.GetModel(), "endpoint", rep.GetEndpoint())
		return nil
	}
	cfg := kv.DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Topic = rep.GetId(), rep.GetUid(), model.GetKvEventsTopic()
	cfg.Dial = r.guard.DialContext
	cfg.StreamTimeout = rs.kvStreamTimeout()
	if listen {
		cfg.Endpoint = model.GetKvEventsListen()[i]
		allow, err := rs.kvAllow(r)
		if err != nil {
			rs.log.Warn("kv_events_listen: no address may connect; routers use tier 1 for the replica",
				"replica", rep.GetId(), "model", rep.GetModel(), "err", err)
			return nil
		}
		cfg.AllowFrom = allow
	} else {
		cfg.Endpoint, cfg.Connect = model.GetKvEventsPublishers()[i], true
	}
	// The engine was running before this listener, whatever it is: the
	// mirror starts with a replay from seq 0 (untrusted if the engine's
	// buffer no longer holds it).
	cfg.CatchUp = true
	if i < len(model.GetKvEventsReplay()) {
		cfg.ReplayEndpoint = model.GetKvEventsReplay()[i]
	}
	return rs.startKV(cfg, rep, model)
}

// kvStreamTimeout is how long an external engine's publisher has to
// connect before its replica is untrusted (Config.KVStreamTimeout).
func (rs *Set) kvStreamTimeout() time.Duration {
	if rs.cfg.KVStreamTimeout > 0 {
		return rs.cfg.KVStreamTimeout
	}
	return DefaultKVStreamTimeout
}

// DefaultKVStreamTimeout is Config.KVStreamTimeout's default: an external
// engine is running already, so its publisher connects (or is connected
// to) within a few redials; a stream silent for this long is not coming.
const DefaultKVStreamTimeout = 10 * time.Second

// kvAllow is who may connect to an external replica's kv_events_listen
// socket: the model's kv_events_allow, or else the addresses the
// replica's endpoint host resolves to, checked by its guard.
func (rs *Set) kvAllow(r *runner) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, a := range r.model.GetKvEventsAllow() {
		p, err := hostcheck.ParseAllow(a)
		if err != nil {
			return nil, fmt.Errorf("kv_events_allow: %w", err)
		}
		out = append(out, p)
	}
	if len(out) > 0 {
		return out, nil
	}
	u, err := url.Parse(r.replica.GetEndpoint())
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", r.replica.GetEndpoint(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), externalDialTimeout)
	defer cancel()
	addrs, err := r.guard.resolve(ctx, "tcp", u.Hostname())
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// isExternal reports whether a runner's replica is one this agent owns
// rather than runs.
func (r *runner) isExternal() bool { return r.model.GetEngine() == engine.External }

// externalRecord is what the agent keeps of an external replica across its
// own restarts: the last incarnation it reported. A new agent cannot know
// whether the engine restarted while no one watched, and its KV mirror
// starts over anyway, so it counts one more — never one fewer, which
// routers would take for an older engine and refuse the KV state of.
type externalRecord struct {
	UID         uint64 `json:"uid"`
	Incarnation uint64 `json:"incarnation"`
}

func (rs *Set) externalPath(id string) string {
	return filepath.Join(rs.cfg.DataDir, "external", url.PathEscape(id)+".json")
}

// nextExternalIncarnation is the incarnation an external replica's
// supervisor starts at: 1, or one past the recorded one of the same
// placement.
func (rs *Set) nextExternalIncarnation(rep *llmgwv1.Replica) uint64 {
	b, err := os.ReadFile(rs.externalPath(rep.GetId()))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			rs.log.Warn("reading an external replica's record", "replica", rep.GetId(), "err", err)
		}
		return 1
	}
	var rec externalRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.UID != rep.GetUid() {
		return 1 // unreadable, or another placement's: this one starts afresh
	}
	return rec.Incarnation + 1
}

// recordExternal keeps the record in step with the incarnations reported.
// Called from the runner's supervisor goroutine, in order.
func (rs *Set) recordExternal(r *runner, st *llmgwv1.ReplicaStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.GetIncarnation() == r.recordedIncarnation {
		return
	}
	b, _ := json.Marshal(externalRecord{UID: st.GetUid(), Incarnation: st.GetIncarnation()})
	p := rs.externalPath(st.GetReplicaId())
	err := os.MkdirAll(filepath.Dir(p), 0o755)
	if err == nil {
		err = datadir.WriteFileAtomic(p, b)
	}
	if err != nil {
		rs.log.Warn("external replica's record not saved; after an agent restart its incarnation may repeat", "replica", st.GetReplicaId(), "err", err)
		return
	}
	r.recordedIncarnation = st.GetIncarnation()
}

// dropExternal forgets a removed replica's record (there may be none).
func (rs *Set) dropExternal(id string) {
	if err := os.Remove(rs.externalPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		rs.log.Warn("removing an external replica's record", "replica", id, "err", err)
	}
}

// Resolver resolves the host names of external engines' endpoints; a
// *net.Resolver is one (net.DefaultResolver unless Config.Resolver says
// otherwise, which is how tests resolve names without a DNS server).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DialFunc makes a TCP connection, as net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ErrEndpointRefused is what a connection to an external engine fails
// with when its host names, or resolves to, an address the model policy
// refuses.
var ErrEndpointRefused = errors.New("external endpoint refused")

// endpointGuard makes every connection the agent opens to one external
// replica's engine: the probes, the load reads, the KV-event sockets
// (design §6 "External engines"). The control plane checks a model's
// endpoints as written when it is applied, without resolving them (fsm
// stays off the network), so a name that passed then may resolve
// anywhere later — a DNS record changed, or rebinding. The guard therefore
// resolves the host itself at each connection, refuses the whole answer if
// any address is one the policy refuses (link-local, a cloud metadata
// service: hostcheck, the rules fsm applies) unless the model sets
// allow_link_local_endpoints, and connects to the addresses it checked,
// never to the name, so no second lookup can answer otherwise.
type endpointGuard struct {
	resolver Resolver
	dial     DialFunc
	allow    bool
	log      *slog.Logger
	refused  prometheus.Counter

	mu sync.Mutex
	// lastRefusal is the refusal logged last: one that repeats at every
	// probe is logged once, until the endpoint connects or is refused for
	// another reason.
	lastRefusal string
}

// externalDialTimeout bounds one connection attempt of the guard's own
// dialer; the callers' contexts and timeouts bound the rest.
const externalDialTimeout = 10 * time.Second

// newGuard returns the guard of an external replica of model.
func (rs *Set) newGuard(rep *llmgwv1.Replica, model *llmgwv1.Model) *endpointGuard {
	g := &endpointGuard{resolver: rs.cfg.Resolver, dial: rs.cfg.Dial, allow: model.GetAllowLinkLocalEndpoints(),
		log: rs.log.With("replica", rep.GetId(), "model", rep.GetModel()), refused: rs.metrics.externalRefused}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	if g.dial == nil {
		g.dial = (&net.Dialer{Timeout: externalDialTimeout}).DialContext
	}
	return g
}

// DialContext connects to addr (host:port) as the guard allows.
func (g *endpointGuard) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	addrs, err := g.resolve(ctx, network, host)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, a := range addrs {
		c, err := g.dial(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			g.mu.Lock()
			g.lastRefusal = ""
			g.mu.Unlock()
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// resolve returns the addresses host may be reached at, checked.
func (g *endpointGuard) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if !g.allow {
		if why := hostcheck.Host(host); why != "" {
			return nil, g.refuse(fmt.Errorf("%w: host %q is %s; set allow_link_local_endpoints: true to allow it", ErrEndpointRefused, host, why))
		}
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ipNet := "ip"
		switch network {
		case "tcp4":
			ipNet = "ip4"
		case "tcp6":
			ipNet = "ip6"
		}
		if addrs, err = g.resolver.LookupNetIP(ctx, ipNet, host); err != nil {
			return nil, fmt.Errorf("resolving external endpoint host %q: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("resolving external endpoint host %q: no address", host)
		}
	}
	if g.allow {
		return addrs, nil
	}
	for _, a := range addrs {
		if why := hostcheck.Addr(a); why != "" {
			return nil, g.refuse(fmt.Errorf("%w: host %q resolves to %s, %s; set allow_link_local_endpoints: true to allow it",
				ErrEndpointRefused, host, a, why))
		}
	}
	return addrs, nil
}

// refuse counts and logs a refusal (once while it repeats) and returns it.
func (g *endpointGuard) refuse(err error) error {
	g.refused.Inc()
	g.mu.Lock()
	repeat := g.lastRefusal == err.Error()
	g.lastRefusal = err.Error()
	g.mu.Unlock()
	if !repeat {
		g.log.Warn("connection to an external engine refused", "err", err)
	}
	return err
}

// DialEngine makes the load reader's connections to the node's engines
// (design §6 "Load snapshots"): through the endpoint guard of the external
// replica whose address addr is — the strictest, should two models name
// the same engine — and directly to an engine llmgw runs.
func (rs *Set) DialEngine(ctx context.Context, network, addr string) (net.Conn, error) {
	if g := rs.guardAt(addr); g != nil {
		return g.DialContext(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (rs *Set) guardAt(addr string) *endpointGuard {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var found *endpointGuard
	for _, r := range rs.running {
		if r.guard == nil {
			continue
		}
		r.mu.Lock()
		at := r.launch.Address
		r.mu.Unlock()
		if at == addr && (found == nil || found.allow) {
			found = r.guard
		}
	}
	return found
}
