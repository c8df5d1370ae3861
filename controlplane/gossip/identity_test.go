package gossip

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
)

const (
	clusterA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	clusterB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// TestClusterIdentity: gossip merges servers of one cluster and fresh ones
// that know no id yet, and refuses, in both directions of a join, a server
// of another cluster — the fresh `--bootstrap` server that once took a
// cluster over (design §5.2 "Cluster identity").
func TestClusterIdentity(t *testing.T) {
	a, _ := startMember(t, "a", Security{})
	a.SetCluster(clusterA)
	b, _ := startMember(t, "b", Security{})
	b.SetCluster(clusterA)
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatalf("a server of the same cluster: %v", err)
	}
	fresh, _ := startMember(t, "fresh", Security{})
	if _, err := fresh.Join([]string{a.Addr()}); err != nil {
		t.Fatalf("a fresh server, no id yet: %v", err)
	}
	testkit.Wait(t, "a, b and the fresh server alive everywhere", func() bool { return alive(a) == 3 && alive(b) == 3 && alive(fresh) == 3 })

	other, _ := startMember(t, "other", Security{})
	other.SetCluster(clusterB)
	tests := []struct {
		name       string
		from, to   *Gossip
		wantRefuse string
	}{
		{"the foreign server joins the cluster", other, a, "belongs to cluster"},
		{"the cluster joins the foreign server (llmgwctl join)", a, other, "belongs to cluster"},
		{"another member joins it", b, other, "belongs to cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.from.Join([]string{tt.to.Addr()})
			if !errors.Is(err, ErrForeignCluster) || !strings.Contains(err.Error(), tt.wantRefuse) {
				t.Fatalf("join: %v, want a refusal containing %q", err, tt.wantRefuse)
			}
		})
	}
	// Nothing of the refused server reaches the cluster, even after a
	// few gossip rounds, nor the cluster it.
	if err := testkit.Throughout(2*fast.PushPullInterval, fast.GossipInterval/2, func() error {
		for _, g := range []*Gossip{a, b, fresh} {
			if _, ok := g.Snapshot()["other"]; ok {
				return fmt.Errorf("%s knows the foreign server", g.Self().ID)
			}
		}
		if n := len(other.Snapshot()); n != 1 {
			return fmt.Errorf("the foreign server knows %d members, want itself alone", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := a.Self().Cluster; got != clusterA {
		t.Fatalf("a's metadata carries cluster %q, want %q", got, clusterA)
	}
}

func TestDecodeMetaClusterID(t *testing.T) {
	if _, err := DecodeMeta([]byte(`{"id":"a","g":"a:1","r":"a:2","c":"not-hex"}`)); err == nil || !strings.Contains(err.Error(), "not a cluster id") {
		t.Fatalf("a malformed cluster id: %v", err)
	}
	m, err := DecodeMeta([]byte(`{"id":"a","g":"a:1","r":"a:2","c":"` + clusterA + `"}`))
	if err != nil || m.Cluster != clusterA {
		t.Fatalf("a valid one: %+v, %v", m, err)
	}
}
