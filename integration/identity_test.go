package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The cluster identity (issue 26, design §5.2 "Cluster identity"), with real
// processes: a fresh server started with --bootstrap by mistake, holding a
// server certificate of the cluster's CA and the gossip key, used to take
// the cluster over once an operator ran `llmgwctl join` towards it — it
// added the real servers to its one-server configuration and they followed
// its log, losing theirs. Now it mints a cluster id of its own, and gossip,
// Raft and the leader's reconcile refuse it.

const (
	// identityModels is how many models the cluster holds: enough that a
	// state replaced by the newcomer's (which has none) cannot pass.
	identityModels = 50
	// identityKey is the router API key the cluster holds.
	identityKey = "router-key"
	// identityWatch is how long the test watches that the newcomer stays
	// out after the joins: the joins are synchronous and the leader
	// reconciles gossip members into Raft within a second, so a takeover
	// shows well within it. Like neverPeer's length it is not scaled.
	identityWatch = 5 * time.Second
)

// identityView is the part of `llmgwctl cluster status -o json` this test
// reads.
type identityView struct {
	ClusterID string `json:"cluster_id"`
	Leader    string `json:"leader"`
	// LastTerm is the term of the server's last Raft log entry.
	LastTerm uint64 `json:"raft_last_term"`
}

func (s *controlServer) identity() (identityView, error) {
	var v identityView
	out, err := s.ctl("cluster", "status", "-o", "json")
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return v, fmt.Errorf("decode cluster status: %w: %s", err, out)
	}
	return v, nil
}

// idFile is the cluster id s keeps in its data dir, "" when it has none.
func (s *controlServer) idFile() string {
	b, _ := os.ReadFile(filepath.Join(s.dataDir, "cluster-id"))
	return strings.TrimSpace(string(b))
}

// leaderChanges is s's llmgw_control_raft_leader_changes_total.
func leaderChanges(t *testing.T, s *controlServer) float64 {
	t.Helper()
	return testkit.MustScrape(t, s.http, "llmgw_control_raft_leader_changes_total", nil)
}

// waitClusterID waits until every server in among reports the same
// non-empty cluster id, in `cluster status` and in its data dir, and
// returns it.
func waitClusterID(t *testing.T, among []*controlServer, timeout time.Duration) string {
	t.Helper()
	var id string
	testkit.WaitErr(t, within(timeout), fmt.Sprintf("one cluster id on %v", ids(among)), func() error {
		id = ""
		for _, s := range among {
			v, err := s.identity()
			if err != nil {
				return fmt.Errorf("%s: %w", s.id, err)
			}
			if v.ClusterID == "" || len(v.ClusterID) != 32 {
				return fmt.Errorf("%s reports cluster id %q", s.id, v.ClusterID)
			}
			if f := s.idFile(); f != v.ClusterID {
				return fmt.Errorf("%s reports cluster id %q, its data dir holds %q", s.id, v.ClusterID, f)
			}
			if id != "" && v.ClusterID != id {
				return fmt.Errorf("%s reports cluster id %s, another server %s", s.id, v.ClusterID, id)
			}
			id = v.ClusterID
		}
		return nil
	})
	return id
}

// modelNames is `llmgwctl model list -o json` at s, sorted.
func (s *controlServer) modelNames() ([]string, error) {
	out, err := s.ctl("model", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode model list: %w: %s", err, out)
	}
	names := []string{}
	for _, m := range list {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names, nil
}

// keyNames is `llmgwctl apikey list -o json` at s.
func (s *controlServer) keyNames() ([]string, error) {
	out, err := s.ctl("apikey", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode apikey list: %w: %s", err, out)
	}
	names := []string{}
	for _, k := range list {
		names = append(names, k.Name)
	}
	return names, nil
}

// waitModelsAndKey waits until every server in among lists exactly the models
// want and the key identityKey.
func waitModelsAndKey(t *testing.T, among []*controlServer, want []string, timeout time.Duration) {
	t.Helper()
	testkit.WaitErr(t, within(timeout), fmt.Sprintf("the %d models and the key %q on %v", len(want), identityKey, ids(among)), func() error {
		for _, s := range among {
			got, err := s.modelNames()
			if err != nil {
				return fmt.Errorf("%s: %w", s.id, err)
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s lists %d models: %v", s.id, len(got), got)
			}
			keys, err := s.keyNames()
			if err != nil {
				return fmt.Errorf("%s: %w", s.id, err)
			}
			if !slices.Equal(keys, []string{identityKey}) {
				return fmt.Errorf("%s lists the keys %v", s.id, keys)
			}
		}
		return nil
	})
}

// TestClusterIdentityRefusesABootstrappedNewcomer is issue 26's must-show.
// A 3-server cluster with mutual TLS and a gossip key, formed with
// --bootstrap-expect 3, holds 50 models and a router API key; its servers
// agree on one cluster id. A fourth server with a server certificate of the
// same CA and the same gossip key is started with --bootstrap: it leads a
// cluster of its own, with another id, at a term ahead of the cluster's (it
// is restarted until it is: the case where, followed, it would replace
// their logs with its own). `llmgwctl join` from a real server
// towards it fails naming the refusal, and so does the join the other way.
// For the watch that follows, no real server lists it in gossip or in Raft,
// the leader stays and no server counts a leader change. Then the
// newcomer is stopped and the three are restarted, all of them: they elect
// a leader and hold the 50 models, the key and the same cluster id.
//
// Without the identity's checks (gossip's merge guard, Raft's transport
// guard and handshake, the leader's reconcile), both joins succeed, the
// newcomer adds the three to its configuration and they follow it, and
// after the restart they hold its log: no model, and it among their peers.
func TestClusterIdentityRefusesABootstrappedNewcomer(t *testing.T) {
	began := time.Now()
	p := newPKI(t)
	keyPath, _ := keyFile(t)
	c := startTLSKeyed(t, p, keyPath, 3)
	servers := c.servers
	clusterID := waitClusterID(t, servers, 30*time.Second)

	// The state: 50 models (sim, one replica each: with no agent none is
	// placed) and one router key.
	leader := c.waitLeader(servers, formTimeout)
	a := llmgwv1.NewAdminServiceClient(dialAs(t, leader.grpc, p.source(mtls.RoleAdmin, "ops")))
	var models []string
	for i := range identityModels {
		name := fmt.Sprintf("m%02d", i)
		models = append(models, name)
		ctx, cancel := context.WithTimeout(context.Background(), within(10*time.Second))
		_, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
			Name: name, Engine: "sim", Model: "llmgw/" + name, Replicas: 1, GpusPerReplica: 1}})
		cancel()
		if err != nil {
			t.Fatalf("apply model %s: %v", name, err)
		}
	}
	if out, err := leader.ctl("apikey", "create", identityKey); err != nil {
		t.Fatalf("apikey create: %v: %s", err, out)
	}
	waitModelsAndKey(t, servers, models, 30*time.Second)

	leader = c.waitLeader(servers, formTimeout)
	changes := map[string]float64{}
	for _, s := range servers {
		changes[s.id] = leaderChanges(t, s)
	}
	t.Logf("cluster %s formed with leader %s and the state in %v; leader changes %v", clusterID, leader.id, time.Since(began).Round(time.Millisecond), changes)

	// The newcomer: a valid server certificate, the gossip key, --bootstrap
	// and no --join. It leads a one-server cluster of its own, which mints
	// its own id.
	c4 := tlsServer(t, p, "c4", serverOpts{extra: []string{"--gossip-key-file", keyPath, "--bootstrap"}})
	var newcomer identityView
	c4.start()
	waitLone := func() {
		t.Helper()
		testkit.WaitErr(t, within(30*time.Second), "c4 to lead a cluster of its own with an id", func() error {
			v, err := c4.identity()
			if err != nil {
				return err
			}
			if v.Leader != "c4" || v.ClusterID == "" || v.LastTerm == 0 {
				return fmt.Errorf("c4 reports leader %q, cluster id %q, last term %d", v.Leader, v.ClusterID, v.LastTerm)
			}
			newcomer = v
			return nil
		})
	}
	waitLone()
	// The worst case: the newcomer's term is ahead of the cluster's, so
	// that, were it followed, its log would replace theirs (at an equal
	// term the real servers' entries happen to survive). Each restart of
	// a lone server is an election at the next term.
	ours, err := leader.identity()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; newcomer.LastTerm <= ours.LastTerm; i++ {
		if i == 5 {
			t.Fatalf("c4 is at term %d after %d restarts, the cluster at %d", newcomer.LastTerm, i, ours.LastTerm)
		}
		c4.stop()
		c4.start()
		waitLone()
	}
	if newcomer.ClusterID == clusterID {
		t.Fatalf("c4, started with --bootstrap, reports the cluster's id %s", clusterID)
	}
	t.Logf("c4 leads cluster %s at term %d; the cluster is at term %d", newcomer.ClusterID, newcomer.LastTerm, ours.LastTerm)
	newcomerID := newcomer.ClusterID

	// The operator's mistake, both ways: each join fails, naming the
	// refusal.
	joins := []struct {
		from *controlServer
		to   string
	}{{leader, c4.gossip}, {c4, leader.gossip}}
	for _, j := range joins {
		out, err := j.from.ctl("join", j.to)
		if err == nil {
			t.Fatalf("llmgwctl --addr %s join %s succeeded: %s", j.from.id, j.to, out)
		}
		if msg := err.Error(); !strings.Contains(msg, "refused") || !strings.Contains(msg, "belongs to cluster") {
			t.Fatalf("llmgwctl --addr %s join %s: %v; want the refusal (\"refused: ... belongs to cluster ...\")", j.from.id, j.to, err)
		}
		t.Logf("llmgwctl --addr %s join %s: %v", j.from.id, j.to, err)
	}

	// The watch: what a takeover would change, sampled on every real
	// server until identityWatch has passed.
	reads := 0
	if err := testkit.Throughout(identityWatch, 100*time.Millisecond, func() error {
		for _, s := range servers {
			m, err := s.memberStatus()
			if err != nil {
				return fmt.Errorf("%s server members: %w", s.id, err)
			}
			if st, ok := m["c4"]; ok {
				return fmt.Errorf("%s lists c4 in gossip (%s): %v", s.id, st, m)
			}
			peers, err := s.peers()
			if err != nil {
				return fmt.Errorf("%s raft list-peers: %w", s.id, err)
			}
			var pids []string
			for _, x := range peers {
				pids = append(pids, x.ID)
			}
			if !slices.Equal(pids, ids(servers)) {
				return fmt.Errorf("%s lists the Raft peers %v, want %v", s.id, pids, ids(servers))
			}
			v, err := s.identity()
			if err != nil {
				return fmt.Errorf("%s cluster status: %w", s.id, err)
			}
			if v.Leader != leader.id || v.ClusterID != clusterID {
				return fmt.Errorf("%s reports leader %q and cluster id %q; before the joins: %s and %s", s.id, v.Leader, v.ClusterID, leader.id, clusterID)
			}
			if n := leaderChanges(t, s); n != changes[s.id] {
				return fmt.Errorf("%s counted %v leader changes since the joins", s.id, n-changes[s.id])
			}
			reads++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The newcomer took in none of the cluster either.
	if m, err := c4.memberStatus(); err != nil || len(m) != 1 {
		t.Errorf("c4 sees the members %v (%v), want itself alone", m, err)
	}
	if v, err := c4.identity(); err != nil || v.ClusterID != newcomerID || v.Leader != "c4" {
		t.Errorf("c4 reports %+v (%v), want its own id %s and itself leading", v, err, newcomerID)
	}
	refused := 0.0
	for _, s := range servers {
		refused += testkit.MustScrape(t, s.http, "llmgw_control_raft_refused_rpcs_total", nil)
	}
	t.Logf("watched %v (%d reads of 3 servers' members, peers, status and metrics): c4 stayed out, leader %s unchanged; Raft RPCs refused: %v",
		identityWatch, reads/len(servers), leader.id, refused)

	// The newcomer goes; the three are stopped, all of them, and started
	// again from their data dirs.
	c4.stop()
	for _, s := range servers {
		s.stop()
	}
	restarted := time.Now()
	for _, s := range servers {
		s.start()
	}
	c.waitLeader(servers, formTimeout)
	waitModelsAndKey(t, servers, models, 30*time.Second)
	if id := waitClusterID(t, servers, 30*time.Second); id != clusterID {
		t.Fatalf("after the full restart the cluster id is %s, was %s", id, clusterID)
	}
	c.waitPeers(servers, ids(servers), formTimeout)
	t.Logf("full restart: a leader, the %d models, the key and cluster id %s back in %v; test took %v",
		identityModels, clusterID, time.Since(restarted).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
