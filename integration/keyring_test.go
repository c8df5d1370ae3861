package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// Gossip encryption with a rotatable keyring (issue #12, design §11), with
// real processes: servers started with the same --gossip-key-file form a
// cluster that a server with another key, or none, cannot join; the keyring
// is rotated with llmgwctl under chat load with no failed request; and a
// server restarted after the rotation comes back with the persisted keys.

// keyFile writes a fresh key from `llmgwctl keyring generate` into a file.
func keyFile(t *testing.T) (path, key string) {
	t.Helper()
	out, err := ctlAt("127.0.0.1:1", "keyring", "generate")
	if err != nil {
		t.Fatal(err)
	}
	key = strings.TrimSpace(out)
	path = filepath.Join(t.TempDir(), "gossip.key")
	writeFile(t, path, key+"\n")
	return path, key
}

// startKeyedCluster is startCluster with every server given file as its
// --gossip-key-file.
func startKeyedCluster(t *testing.T, n int, file string) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := 1; i <= n; i++ {
		c.servers = append(c.servers, newServer(t, fmt.Sprintf("c%d", i), serverOpts{extra: []string{"--gossip-key-file", file}}))
	}
	c.startJoined()
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	return c
}

// memberStatus is `llmgwctl server members` as id → status.
func (s *controlServer) memberStatus() (map[string]string, error) {
	out, err := s.ctl("server", "members", "-o", "json")
	if err != nil {
		return nil, err
	}
	var v []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("decode members: %w: %s", err, out)
	}
	m := map[string]string{}
	for _, x := range v {
		m[x.ID] = x.Status
	}
	return m, nil
}

// waitAlive waits until every server in among sees exactly want alive in
// gossip.
func (c *cluster) waitAlive(among []*controlServer, want []string, timeout time.Duration) {
	c.t.Helper()
	var why string
	if !eventually(timeout, func() bool {
		for _, s := range among {
			m, err := s.memberStatus()
			if err != nil {
				why = fmt.Sprintf("%s: %v", s.id, err)
				return false
			}
			var alive []string
			for id, st := range m {
				if st == "alive" {
					alive = append(alive, id)
				}
			}
			sort.Strings(alive)
			if !slices.Equal(alive, want) {
				why = fmt.Sprintf("%s sees %v alive", s.id, alive)
				return false
			}
		}
		return true
	}) {
		c.t.Fatalf("gossip members are not %v alive within %v: %s", want, within(timeout), why)
	}
}

// neverMember checks, for d, that no server in among lists id in gossip,
// in any status (a member seen once stays listed).
func (c *cluster) neverMember(among []*controlServer, id string, d time.Duration) {
	c.t.Helper()
	read := 0
	if err := testkit.Throughout(d, 100*time.Millisecond, func() error {
		for _, s := range among {
			m, err := s.memberStatus()
			if err != nil {
				continue
			}
			read++
			if st, ok := m[id]; ok {
				return fmt.Errorf("%s lists %s in gossip (%s): %v", s.id, id, st, m)
			}
		}
		return nil
	}); err != nil {
		c.t.Fatal(err)
	}
	if read == 0 {
		c.t.Fatalf("could not read the members of %v to see that %s stays out", ids(among), id)
	}
}

// waitDead waits until s sees the stopped server dead in gossip, so that
// seeing it alive later means it came back.
func waitDead(t *testing.T, s, dead *controlServer) {
	t.Helper()
	if !eventually(30*time.Second, func() bool {
		m, err := s.memberStatus()
		return err == nil && m[dead.id] == "dead"
	}) {
		t.Fatalf("%s does not see the stopped %s dead within %v", s.id, dead.id, within(30*time.Second))
	}
}

// keyringView is `llmgwctl keyring ... -o json`: one item per server.
type keyringView []struct {
	ServerID string `json:"server_id"`
	Keys     []struct {
		Fingerprint string `json:"fingerprint"`
		Primary     bool   `json:"primary"`
	} `json:"keys"`
	Error string `json:"error"`
}

// keyring runs `llmgwctl keyring ARGS -o json` at s and returns each
// server's keys as "fp*,fp" (primary starred), by server id.
func (s *controlServer) keyring(args ...string) (map[string]string, error) {
	got, _, err := s.keyringAnswers(args...)
	return got, err
}

// keyringAnswers is keyring with each server's error, by server id, read
// even when the command failed (it prints the table first).
func (s *controlServer) keyringAnswers(args ...string) (keys, errs map[string]string, err error) {
	out, err := s.ctl(append(append([]string{"keyring"}, args...), "-o", "json")...)
	var v keyringView
	if jerr := json.Unmarshal([]byte(out), &v); jerr != nil {
		if err == nil {
			err = fmt.Errorf("decode keyring: %w: %s", jerr, out)
		}
		return nil, nil, err
	}
	got, errs := map[string]string{}, map[string]string{}
	for _, srv := range v {
		if srv.Error != "" {
			errs[srv.ServerID] = srv.Error
		}
		var ks []string
		for _, k := range srv.Keys {
			if k.Primary {
				ks = append(ks, k.Fingerprint+"*")
			} else {
				ks = append(ks, k.Fingerprint)
			}
		}
		got[srv.ServerID] = strings.Join(ks, ",")
	}
	return got, errs, err
}

// sameOnAll checks that keyring answers for every id in want with keys.
func sameOnAll(t *testing.T, step string, got map[string]string, want []string, keys string) {
	t.Helper()
	for _, id := range want {
		if got[id] != keys {
			t.Fatalf("%s: %s has keys %q, want %q (all: %v)", step, id, got[id], keys, got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: answers from %v, want %v", step, got, want)
	}
}

// TestGossipKeyKeepsOutOtherKeys: a 3-server cluster started with one key
// file; a server started with another key, and one with none, each
// --join'ing the cluster, never appear in its gossip members or Raft
// peers, and the cluster stays at 3.
func TestGossipKeyKeepsOutOtherKeys(t *testing.T) {
	file, _ := keyFile(t)
	c := startKeyedCluster(t, 3, file)
	other, _ := keyFile(t)
	var join []string
	for _, s := range c.servers {
		join = append(join, s.gossip)
	}
	outsiders := []*controlServer{
		newServer(t, "c4", serverOpts{join: join, extra: []string{"--gossip-key-file", other}}),
		newServer(t, "c5", serverOpts{join: join}),
	}
	for _, o := range outsiders {
		o.start()
	}
	// Joins are retried every second: the check lasts several retries and
	// push/pull rounds, what a join that could happen would take.
	for _, o := range outsiders {
		c.neverMember(c.servers, o.id, 4*time.Second)
		c.neverPeer(c.servers, o.id, time.Second)
	}
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	c.waitAlive(c.servers, ids(c.servers), formTimeout)
	for _, o := range outsiders {
		if m, err := o.memberStatus(); err == nil && len(m) != 1 {
			t.Errorf("%s, without the cluster's key, sees %v", o.id, m)
		}
	}
}

// TestKeyringRotationUnderLoad: with the agent, two routers and a steady
// chat load, the keyring is rotated on every server with llmgwctl —
// install the new key, use it, remove the old one — with no failed client
// request; gossip stays whole throughout; then a server restarted with its
// old key file rejoins with the persisted (rotated) keyring, and a new
// server holding only the old key cannot join.
func TestKeyringRotationUnderLoad(t *testing.T) {
	oldFile, oldKey := keyFile(t)
	c := startKeyedCluster(t, 3, oldFile)
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.grpc)
	}
	startAgentProc(t, "n1", addrs)
	routers := []*controlServer{
		startRouterProc(t, "r1", c.servers[0].grpc, c.servers[1].grpc, c.servers[2].grpc),
		startRouterProc(t, "r2", c.servers[1].grpc, c.servers[2].grpc, c.servers[0].grpc),
	}
	applyModel(t, c.servers[0].grpc, "chat", 2)
	waitServing(t, c.servers[0].grpc, "chat", 2, routers...)

	all := ids(c.servers)
	before, err := c.servers[0].keyring("list")
	if err != nil {
		t.Fatal(err)
	}
	oldFP := strings.TrimSuffix(before["c1"], "*")
	sameOnAll(t, "list", before, all, oldFP+"*")

	newKeyOut, err := c.servers[0].ctl("keyring", "generate")
	if err != nil {
		t.Fatal(err)
	}
	newKey := strings.TrimSpace(newKeyOut)

	l := startLoad("chat", 2, routers...)
	l.carry(t, time.Second, 20, "before the rotation")
	// Each step through a different server: any server runs it on all.
	got, err := c.servers[1].keyring("install", newKey)
	if err != nil {
		t.Fatal(err)
	}
	newFP := ""
	for _, k := range strings.Split(got["c1"], ",") {
		if k != oldFP+"*" {
			newFP = k
		}
	}
	sameOnAll(t, "install", got, all, oldFP+"*,"+newFP)
	l.carry(t, time.Second, 20, "after install")
	if got, err = c.servers[2].keyring("use", newKey); err != nil {
		t.Fatal(err)
	}
	sameOnAll(t, "use", got, all, newFP+"*,"+oldFP)
	l.carry(t, time.Second, 20, "after use")
	// The primary cannot be removed; the refusal names it, per server.
	if _, err := c.servers[0].ctl("keyring", "remove", newKey); err == nil || !strings.Contains(err.Error(), "primary key") {
		t.Fatalf("removing the primary: %v, want a refusal naming the primary key", err)
	}
	if got, err = c.servers[0].keyring("remove", oldKey); err != nil {
		t.Fatal(err)
	}
	sameOnAll(t, "remove", got, all, newFP+"*")
	// Gossip carried on: every server still sees the others alive, past a
	// few push/pull rounds under the new key alone.
	l.carry(t, 2*time.Second, 40, "after remove")
	c.waitAlive(c.servers, all, 10*time.Second)
	l.checkNoFailures(t, 100)

	// A restart with the old key file: the persisted keyring wins, so the
	// server rejoins gossip (the others see it alive again) and answers
	// with the new key.
	restarted := c.servers[2]
	restarted.stop()
	waitDead(t, c.servers[0], restarted)
	restarted.start()
	c.waitLeader(c.servers, formTimeout)
	c.waitAlive(c.servers, all, formTimeout)
	if got, err = restarted.keyring("list"); err != nil {
		t.Fatal(err)
	}
	sameOnAll(t, "list after the restart", got, all, newFP+"*")

	// A new server holding only the removed key cannot join.
	stale := newServer(t, "c4", serverOpts{join: []string{c.servers[0].gossip}, extra: []string{"--gossip-key-file", oldFile}})
	stale.start()
	c.neverMember(c.servers, "c4", 4*time.Second)
}

// TestKeyringCatchUpAfterMissedRotation: a server down for a whole
// rotation is reported as not reached at each step (and the command
// fails), comes back with only the removed key and stays out of gossip;
// install and use of the current key run on it alone (--addr naming it)
// bring it back in, and the last remove then succeeds everywhere.
func TestKeyringCatchUpAfterMissedRotation(t *testing.T) {
	oldFile, oldKey := keyFile(t)
	c := startKeyedCluster(t, 3, oldFile)
	c1, c3 := c.servers[0], c.servers[2]
	c3.stop()
	c.waitLeader(c.servers[:2], formTimeout)
	waitDead(t, c1, c3)
	_, newKey := keyFile(t)
	for _, step := range [][]string{{"install", newKey}, {"use", newKey}, {"remove", oldKey}} {
		keys, errs, err := c1.keyringAnswers(step...)
		if err == nil || !strings.Contains(errs["c3"], "not alive in gossip") || len(keys) != 3 || len(errs) != 1 {
			t.Fatalf("%s with c3 down: keys %v, errors %v, %v; want c3 alone reported not reached, and the command to fail", step[0], keys, errs, err)
		}
	}
	c3.start()
	// Its --join retries (every second) cannot get through with the removed
	// key alone: c1 never sees it alive again.
	if err := testkit.Throughout(4*time.Second, 100*time.Millisecond, func() error {
		if m, err := c1.memberStatus(); err == nil && m["c3"] == "alive" {
			return fmt.Errorf("c3 rejoined gossip with only the removed key: %v", m)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Once the new key is installed on c3, the others' reconnect loop (it
	// dials a dead member every few seconds, with the new key, which c3
	// can now read) may bring c3 back before the "use": then the command
	// reaches every server, which holds the key too. What counts is that
	// it is done on c3.
	for _, step := range [][]string{{"install", newKey}, {"use", newKey}} {
		keys, errs, err := c3.keyringAnswers(step...)
		if keys["c3"] == "" || errs["c3"] != "" || (err != nil) != (len(errs) > 0) {
			t.Fatalf("%s at c3: keys %v, errors %v, %v; want it done on c3 (the others reached or not)", step[0], keys, errs, err)
		}
	}
	c.waitAlive(c.servers, ids(c.servers), formTimeout)
	// Gossip may call c3 alive a moment before c1's pooled gRPC
	// connection to it has redialled (seen under load in CI): a remove
	// that could not reach a server is sent again; removing a key a
	// server no longer holds is no error.
	var got map[string]string
	var rerr error
	_ = eventuallyErr(formTimeout, func() error {
		got, rerr = c1.keyring("remove", oldKey)
		if rerr != nil && strings.Contains(rerr.Error(), "Unavailable") {
			return rerr // sent again
		}
		return nil // done, or a failure to report below
	})
	if rerr != nil {
		t.Fatal(rerr)
	}
	newFP := strings.Split(got["c1"], ",")[0]
	sameOnAll(t, "remove after the catch-up", got, ids(c.servers), newFP)
}
