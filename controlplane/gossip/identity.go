package gossip

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrForeignCluster is a join refused because the other side belongs to
// another cluster (design §5.2 "Cluster identity").
var ErrForeignCluster = errors.New("a server of another cluster")

// foreignWords are the words of the identity guard's refusal, which reach
// a joiner only as text inside memberlist's error.
const foreignWords = "belongs to cluster"

// SetCluster records the cluster's identity (design §5.2 "Cluster
// identity") once this server knows it, and re-announces this server's
// metadata with it, so the others can refuse it if theirs differs (and it
// them). Calls after the first with the same id change nothing.
func (g *Gossip) SetCluster(id string) {
	if old := g.cluster.Load(); old != nil && *old == id {
		return
	}
	g.cluster.Store(&id)
	if ml := g.ml.Load(); ml != nil {
		if err := ml.UpdateNode(5 * time.Second); err != nil {
			g.log.Warn("announcing the cluster id over gossip failed; the next push/pull carries it", "err", err)
		}
	}
}

// ClusterID is the cluster id this server announces, "" before it knows one.
func (g *Gossip) ClusterID() string {
	if id := g.cluster.Load(); id != nil {
		return *id
	}
	return ""
}

// foreign says why member n, as its metadata describes it, belongs to
// another cluster than this server's, "" when it may be merged: a member
// or this server that knows no id yet (a fresh server joining, or one of a
// release before identities) is not refused here — Raft's guard and the
// leader's reconcile hold the line for those.
func (g *Gossip) foreign(n *memberlist.Node) string {
	if n == nil || n.Name == g.self.ID {
		return ""
	}
	ours := g.ClusterID()
	if ours == "" {
		return ""
	}
	m, err := DecodeMeta(n.Meta)
	if err != nil || m.Cluster == "" || m.Cluster == ours {
		return ""
	}
	return fmt.Sprintf("server %s (%s) %s %s, this server to cluster %s", n.Name, n.Address(), foreignWords, m.Cluster, ours)
}

// refused logs a refusal once per member and foreign cluster id.
func (g *Gossip) refused(n *memberlist.Node, why, how string) {
	m, _ := DecodeMeta(n.Meta)
	if _, seen := g.refusedLogged.LoadOrStore(n.Name+"/"+m.Cluster, true); seen {
		return
	}
	g.log.Error("gossip refused a server of another cluster", "member", n.Name, "addr", n.Address(), "its_cluster_id", m.Cluster, "cluster_id", g.ClusterID(), "refused", how, "reason", why)
}

// identityGuard is memberlist's MergeDelegate and AliveDelegate: the
// place where gossip meets a server of another cluster — a join or
// push/pull with it (NotifyMerge, whose error cancels the exchange, so
// `llmgwctl join` to such a server fails with the reason) and an alive
// message about it (NotifyAlive, whose error keeps it out of the member
// table). Its methods run on memberlist's loops and do not block.
type identityGuard Gossip

func (d *identityGuard) NotifyMerge(peers []*memberlist.Node) error {
	g := (*Gossip)(d)
	for _, n := range peers {
		if why := g.foreign(n); why != "" {
			g.refused(n, why, "join or push/pull")
			return fmt.Errorf("refused: %s", why)
		}
	}
	return nil
}

func (d *identityGuard) NotifyAlive(n *memberlist.Node) error {
	g := (*Gossip)(d)
	if why := g.foreign(n); why != "" {
		g.refused(n, why, "alive message")
		return fmt.Errorf("refused: %s", why)
	}
	return nil
}
