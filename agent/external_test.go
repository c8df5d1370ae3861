package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestExternalReplicaOwned: an external replica placed on the node is owned,
// not run (design §6): READY with the endpoint as address once the engine
// answers /health and lists the model, no process and no engine record, its
// load read from the engine's /metrics, and a drain stops the probing at
// once — there is nothing to wait idle for. An agent restart counts a new
// incarnation, never an older one.
func TestExternalReplicaOwned(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"ext","object":"model"}]}`)
		case "/metrics":
			fmt.Fprint(w, "vllm:num_requests_running{model_name=\"ext\"} 3\nvllm:num_requests_waiting{model_name=\"ext\"} 2\n")
		}
	}))
	defer engine.Close()
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	a, stop := startAgent(t, c)
	defer stop()
	model := &llmgwv1.Model{Name: "ext", Engine: "external", Endpoints: []string{"http://10.9.9.9:8000", engine.URL}}
	set := func(rev uint64, reps ...*llmgwv1.Replica) {
		ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{
			Revision: rev, Replicas: reps, Models: []*llmgwv1.Model{model}}}}
	}
	rep := &llmgwv1.Replica{Id: "ext-3", Uid: 9, Model: "ext", Node: "n1", Endpoint: engine.URL}
	set(10, rep)
	status := func() *llmgwv1.ReplicaStatus {
		_, ups := ctl.snapshot()
		return latest(ups, 0)["ext-3"]
	}
	testkit.Wait(t, "ext-3 READY", func() bool { return status().GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY })
	if st, addr := status(), strings.TrimPrefix(engine.URL, "http://"); st.GetAddress() != addr || st.GetPid() != 0 || st.GetUid() != 9 {
		t.Errorf("status %v, want address %s, no pid, uid 9", st, addr)
	}
	if files, _ := filepath.Glob(filepath.Join(c.DataDir, "engines", "*.json")); len(files) != 0 {
		t.Errorf("engine records %v for an engine llmgw does not run", files)
	}
	testkit.Wait(t, "a load reading of the external engine", func() bool {
		return testkit.Metric(t, a.reg, "llmgw_agent_load_reads_total", testkit.Labels{"result": "ok"}) > 0
	})
	if tg := a.replicas.LoadTargets(); len(tg) != 1 || tg[0].Address != strings.TrimPrefix(engine.URL, "http://") {
		t.Errorf("load targets %v, want the external engine", tg)
	}

	// An agent restart: the next agent cannot know whether the engine
	// restarted meanwhile, and must never report an older incarnation.
	stop()
	a, stop = startAgent(t, c)
	defer stop()
	testkit.Wait(t, "the new agent's hello", func() bool { h, _ := ctl.snapshot(); return len(h) == 2 })
	hellos, _ := ctl.snapshot()
	status = func() *llmgwv1.ReplicaStatus {
		_, ups := ctl.snapshot()
		return latest(ups, hellos[1].GetEpoch())["ext-3"]
	}
	set(10, rep)
	testkit.Wait(t, "ext-3 READY again", func() bool { return status().GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY })
	if st := status(); st.GetIncarnation() != 2 {
		t.Errorf("after the agent's restart: incarnation %d, want 2", st.GetIncarnation())
	}

	drain := &llmgwv1.Replica{Id: "ext-3", Uid: 9, Model: "ext", Node: "n1", Endpoint: engine.URL, Draining: true}
	set(11, drain)
	testkit.Wait(t, "ext-3 STOPPED", func() bool { return status().GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED })
	// The engine reports 3 running and 2 waiting throughout: a drain that
	// waited for idle would reach only the drain timeout (minutes).
	if files, _ := filepath.Glob(filepath.Join(c.DataDir, "engines", "*.json")); len(files) != 0 {
		t.Errorf("engine records %v after the drain", files)
	}
	set(12)
	testkit.Wait(t, "the external replica's record forgotten", func() bool {
		files, _ := filepath.Glob(filepath.Join(c.DataDir, "external", "*.json"))
		return len(files) == 0
	})
}

// rebindingResolver answers every name with its current answer: what a DNS
// record an attacker controls (or an operator changed) says now.
type rebindingResolver struct {
	mu     sync.Mutex
	answer []netip.Addr
}

func (r *rebindingResolver) set(a ...netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = a
}

func (r *rebindingResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answer, nil
}

// TestExternalEndpointResolvedAtConnect holds issue 26's "DNS names in
// external endpoints are resolved and checked when the agent connects, not
// only at apply": an endpoint named by a host name is READY while the name
// resolves to the engine, refused — UNHEALTHY, with the refusal as its
// message, counted and logged — once it resolves to the metadata service,
// and READY again, as a new incarnation, when it resolves back. The name is
// "localhost" and every answer comes from the injected resolver; the
// refused answer is fe80::a9fe:a9fe, which without a zone no socket can
// reach, so nothing leaves the machine whatever the agent did.
func TestExternalEndpointResolvedAtConnect(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"ext","object":"model"}]}`)
		}
	}))
	defer engine.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(engine.URL, "http://"))
	endpoint := "http://localhost:" + port
	res := &rebindingResolver{}
	res.set(netip.MustParseAddr("127.0.0.1"))
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	c.Resolver = res
	a, stop := startAgent(t, c)
	defer stop()
	model := &llmgwv1.Model{Name: "ext", Engine: "external", Endpoints: []string{endpoint}}
	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{
		Revision: 10, Replicas: []*llmgwv1.Replica{{Id: "ext-0", Uid: 9, Model: "ext", Node: "n1", Endpoint: endpoint}},
		Models: []*llmgwv1.Model{model}}}}
	status := func() *llmgwv1.ReplicaStatus {
		_, ups := ctl.snapshot()
		return latest(ups, 0)["ext-0"]
	}
	testkit.Wait(t, "ext-0 READY through the name", func() bool { return status().GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY })
	first := status().GetIncarnation()

	res.set(netip.MustParseAddr("fe80::a9fe:a9fe"))
	testkit.Wait(t, "ext-0 UNHEALTHY once its name resolves to the metadata service", func() bool {
		st := status()
		return st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY &&
			strings.Contains(st.GetMessage(), `host "localhost" resolves to fe80::a9fe:a9fe, a link-local address`)
	})
	if n := testkit.Metric(t, a.reg, "llmgw_agent_external_refused_dials_total", nil); n < 3 {
		t.Errorf("llmgw_agent_external_refused_dials_total = %v, want at least the 3 probes that turned it UNHEALTHY", n)
	}

	res.set(netip.MustParseAddr("127.0.0.1"))
	testkit.Wait(t, "ext-0 READY again once the name resolves back", func() bool {
		st := status()
		return st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && st.GetIncarnation() > first
	})
}
