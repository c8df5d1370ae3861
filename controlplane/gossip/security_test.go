package gossip

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/testkit"
)

// fast are timings that notice joins and deaths in well under a second.
var fast = Config{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
	GossipInterval: 50 * time.Millisecond, SuspicionMult: 2, PushPullInterval: 500 * time.Millisecond}

// recorder is a Plane that keeps what it receives.
type recorder struct {
	mu  sync.Mutex
	got [][]byte
}

func (r *recorder) Receive(msg []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, append([]byte(nil), msg...))
}
func (r *recorder) LocalState() []byte      { return nil }
func (r *recorder) MergeRemoteState([]byte) {}
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// startMember runs a member with id on a loopback port of its own.
func startMember(t *testing.T, id string, sec Security) (*Gossip, *recorder) {
	t.Helper()
	p := &recorder{}
	g := New(Meta{ID: id, GRPC: "127.0.0.1:1", Raft: "127.0.0.1:2"}, p, slog.New(slog.DiscardHandler), time.Now)
	if err := g.Start("127.0.0.1:0", fast, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown() })
	return g, p
}

func with(kr *Keyring, src *mtls.Source) Security { return Security{Keyring: kr, TLS: src} }

// keyring makes a keyring holding key, in a data dir of its own.
func keyring(t *testing.T, key []byte) *Keyring {
	t.Helper()
	kr, err := OpenKeyring(t.TempDir(), writeKeyFile(t, b64(key)))
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// alive is how many members g sees alive, itself included.
func alive(g *Gossip) int {
	n := 0
	for _, m := range g.Snapshot() {
		if m.Status == StatusAlive {
			n++
		}
	}
	return n
}

// staysOut checks for d that neither of in sees more than want members,
// sampling: a join that would happen takes a push/pull, well under d.
func staysOut(t *testing.T, d time.Duration, want int, in ...*Gossip) {
	t.Helper()
	if err := testkit.Throughout(d, 0, func() error {
		for _, g := range in {
			if n := len(g.Snapshot()); n > want {
				return fmt.Errorf("%s sees %d members, want %d: %v", g.Self().ID, n, want, SortedIDs(g.Snapshot()))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEncryptedGossipKeepsOutOtherKeys: servers with the same key form a
// pool; one with another key, or none, cannot join it, neither by its own
// join nor by being joined, and the pool never lists it.
func TestEncryptedGossipKeepsOutOtherKeys(t *testing.T) {
	key := testKey(7, 32)
	a, _ := startMember(t, "a", with(keyring(t, key), nil))
	b, _ := startMember(t, "b", with(keyring(t, key), nil))
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatalf("same key: %v", err)
	}
	testkit.Wait(t, "a and b see each other", func() bool { return alive(a) == 2 && alive(b) == 2 })

	other, _ := startMember(t, "other-key", with(keyring(t, testKey(8, 32)), nil))
	plain, _ := startMember(t, "no-key", Security{})
	for _, g := range []*Gossip{other, plain} {
		if _, err := g.Join([]string{a.Addr()}); err == nil {
			t.Errorf("%s joined a pool encrypted with another key", g.Self().ID)
		}
		if _, err := a.Join([]string{g.Addr()}); err == nil {
			t.Errorf("a joined %s, which lacks the pool's key", g.Self().ID)
		}
	}
	staysOut(t, 2*time.Second, 2, a, b)
	staysOut(t, 0, 1, other, plain)
}

// TestKeyringRotationKeepsThePool: install, use and remove run on every
// member in turn, with reliable sends flowing throughout; the pool stays
// whole, no send fails, and a member that only knows the old key can no
// longer join afterwards. With TLS too, the two layers together.
func TestKeyringRotationKeepsThePool(t *testing.T) {
	t.Run("keyring", func(t *testing.T) { testRotation(t, nil) })
	t.Run("keyring and TLS", func(t *testing.T) { testRotation(t, mtlstest.New(t)) })
}

func testRotation(t *testing.T, ca *mtlstest.CA) {
	source := func(id string) *mtls.Source {
		if ca == nil {
			return nil
		}
		return ca.Source(mtls.RoleServer, id)
	}
	oldKey, newKey := testKey(1, 32), testKey(2, 32)
	var members []*Gossip
	var rings []*Keyring
	var planes []*recorder
	for _, id := range []string{"a", "b", "c"} {
		kr := keyring(t, oldKey)
		g, p := startMember(t, id, with(kr, source(id)))
		members, rings, planes = append(members, g), append(rings, kr), append(planes, p)
	}
	for _, g := range members[1:] {
		if _, err := g.Join([]string{members[0].Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Wait(t, "3 members", func() bool { return alive(members[0]) == 3 && alive(members[1]) == 3 && alive(members[2]) == 3 })

	stop := make(chan struct{})
	var sendErrs []error
	var sent int
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i, g := range members {
				to := members[(i+1)%len(members)].Self().ID
				if err := g.Send(to, planeMsg); err != nil {
					sendErrs = append(sendErrs, err)
				}
				sent++
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	for _, step := range []struct {
		name string
		do   func(*Keyring) error
	}{
		{"install", func(k *Keyring) error { return k.Install(newKey) }},
		{"use", func(k *Keyring) error { return k.Use(newKey) }},
		{"remove", func(k *Keyring) error { return k.Remove(oldKey) }},
	} {
		for i, kr := range rings {
			if err := step.do(kr); err != nil {
				t.Fatalf("%s on %s: %v", step.name, members[i].Self().ID, err)
			}
			time.Sleep(100 * time.Millisecond) // sends between each member's step
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(sendErrs) > 0 {
		t.Fatalf("%d of %d reliable sends failed during the rotation; first: %v", len(sendErrs), sent, sendErrs[0])
	}
	t.Logf("%d reliable sends during the rotation, none failed", sent)
	for i, g := range members {
		if alive(g) != 3 {
			t.Fatalf("%s sees %d alive after the rotation", g.Self().ID, alive(g))
		}
		if planes[i].count() == 0 {
			t.Fatalf("%s received nothing", g.Self().ID)
		}
	}
	stale, _ := startMember(t, "stale", with(keyring(t, oldKey), source("stale")))
	if _, err := stale.Join([]string{members[0].Addr()}); err == nil {
		t.Fatal("a member with only the removed key joined")
	}
}

// TestTLSGossipNeedsAServerCertificate: with TLS, servers holding server
// certificates of the CA form a pool and reliable sends reach them; a
// member with no TLS, with an agent's certificate, or with a server
// certificate of another CA cannot join, whichever side starts the join.
func TestTLSGossipNeedsAServerCertificate(t *testing.T) {
	ca := mtlstest.New(t)
	a, _ := startMember(t, "a", with(nil, ca.Source(mtls.RoleServer, "a")))
	b, pb := startMember(t, "b", with(nil, ca.Source(mtls.RoleServer, "b")))
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatalf("two servers: %v", err)
	}
	testkit.Wait(t, "a and b see each other", func() bool { return alive(a) == 2 && alive(b) == 2 })
	if err := a.Send("b", planeMsg); err != nil {
		t.Fatalf("reliable send over TLS: %v", err)
	}
	testkit.Wait(t, "b receives a's message", func() bool { return pb.count() == 1 })

	outsiders := []struct {
		id  string
		src *mtls.Source
	}{
		{"plain", nil},
		{"agent", ca.Source(mtls.RoleAgent, "agent")},
		{"foreign", mtlstest.New(t).Source(mtls.RoleServer, "foreign")},
	}
	for _, o := range outsiders {
		g, _ := startMember(t, o.id, with(nil, o.src))
		if _, err := g.Join([]string{a.Addr()}); err == nil {
			t.Errorf("%s joined the TLS pool", o.id)
		}
		if _, err := a.Join([]string{g.Addr()}); err == nil {
			t.Errorf("the TLS pool joined %s", o.id)
		}
	}
	staysOut(t, 2*time.Second, 2, a, b)
}

// TestTLSGossipChecksTheName: a stream dialed to a named member demands a
// certificate naming it, so a server's certificate cannot answer for
// another server.
func TestTLSGossipChecksTheName(t *testing.T) {
	ca := mtlstest.New(t)
	a, _ := startMember(t, "a", with(nil, ca.Source(mtls.RoleServer, "a")))
	// "b" runs with the certificate of "imposter".
	b, _ := startMember(t, "b", with(nil, ca.Source(mtls.RoleServer, "imposter")))
	// b dials a by address, with no name to check: the join succeeds. a's
	// streams to "b" by name are what the check refuses.
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "a sees b", func() bool { _, ok := a.Member("b"); return ok })
	if err := a.Send("b", planeMsg); err == nil {
		t.Fatal("a reliable send to b reached a peer whose certificate names another server")
	}
}

// planeMsg is a message the delegate hands to the plane (its kind byte is
// the plane's digest).
var planeMsg = []byte{PlaneDigestKind}
