// Package identity is the cluster's identity (design §5.2 "Cluster
// identity"): a random ID the first leader of a cluster mints and commits
// through Raft, which every server then keeps in its data dir and carries
// in its gossip metadata and its Raft handshake.
//
// Why it exists: TLS proves that a peer is *a* server of the CA, not a
// server of *this* cluster. A fresh server started with --bootstrap by
// mistake holds a valid certificate and the gossip key; without an
// identity, a `llmgwctl join` to it (or gossip redialling a dead member's
// address it reused) let it add the real servers to its own one-node
// configuration, and they followed its log — clearing theirs. Consul
// (#8376, #4074) and etcd answer this the same way: a cluster ID, checked
// at every handshake between servers.
//
// Why both Raft and the data dir: Raft is the authority (every server
// learns the ID by replication, and the FSM refuses to change it), but a
// restarting server needs its ID before its log is replayed — to fill its
// gossip metadata and check its first Raft handshake — so each server
// also writes the ID it adopted to <data-dir>/cluster-id. The two must
// agree: a data dir whose Raft state names another cluster stops the
// server rather than serve it.
package identity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/atomicfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// FileName is the identity's file in a server's data dir.
const FileName = "cluster-id"

// ErrOtherCluster is a replicated identity that differs from the one this
// server's data dir already holds: its Raft state came from another
// cluster.
var ErrOtherCluster = errors.New("the replicated cluster id differs from this data dir's")

// Identity is what one server knows of its cluster's identity: empty
// until it bootstraps, or adopts one from the replicated state. It is safe
// for concurrent use.
type Identity struct {
	path string
	log  *slog.Logger

	mu sync.Mutex
	id string
	// adopted is called, outside mu, each time the ID is first known (at
	// Open when the file exists, or at Adopt).
	adopted []func(id string)
}

// Open reads the identity kept in dataDir, if any. A file that exists but
// does not hold a valid ID is an error naming it: it is never overwritten,
// since it is the only record of which cluster this data dir belongs to.
func Open(dataDir string, log *slog.Logger) (*Identity, error) {
	i := &Identity{path: filepath.Join(dataDir, FileName), log: log}
	b, err := os.ReadFile(i.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return i, nil
	case err != nil:
		return nil, fmt.Errorf("cluster id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !fsm.ValidClusterID(id) {
		return nil, fmt.Errorf("cluster id: %s holds %q, not a cluster id (32 lowercase hex digits); restore it, or remove the data dir to start this server afresh", i.path, trimForLog(id))
	}
	i.id = id
	return i, nil
}

func trimForLog(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// ID is the cluster's identity, "" while this server knows none.
func (i *Identity) ID() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.id
}

// OnAdopt registers f to be called with the ID once it is known: at once
// when it already is, else when Adopt first records it. f must not block.
func (i *Identity) OnAdopt(f func(id string)) {
	i.mu.Lock()
	id := i.id
	if id == "" {
		i.adopted = append(i.adopted, f)
	}
	i.mu.Unlock()
	if id != "" {
		f(id)
	}
}

// Adopt records id, the replicated identity, as this server's: written to
// the data dir (fsynced, then renamed into place) the first time, and
// ErrOtherCluster when this server already holds another one.
func (i *Identity) Adopt(id string) error {
	if !fsm.ValidClusterID(id) {
		return fmt.Errorf("cluster id %q: not a cluster id", trimForLog(id))
	}
	i.mu.Lock()
	switch i.id {
	case id:
		i.mu.Unlock()
		return nil
	case "":
	default:
		held := i.id
		i.mu.Unlock()
		return fmt.Errorf("%w: %s holds %s, the Raft state says %s", ErrOtherCluster, i.path, held, id)
	}
	if err := atomicfile.Write(i.path, []byte(id+"\n"), 0o600); err != nil {
		i.mu.Unlock()
		return fmt.Errorf("cluster id: %w", err)
	}
	i.id = id
	fs := i.adopted
	i.adopted = nil
	i.mu.Unlock()
	i.log.Info("cluster id adopted", "cluster_id", id, "file", i.path)
	for _, f := range fs {
		f(id)
	}
	return nil
}

// Mint returns a new cluster ID: 128 bits from r (crypto/rand's Reader
// when nil), as 32 lowercase hex digits.
func Mint(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	b := make([]byte, 16)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("mint cluster id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// State is the replicated state as Run and EnsureMinted read it (package
// fsm's FSM).
type State interface {
	Config() *llmgwv1.ClusterConfig
	// Applied returns the applied revision and a channel closed at the
	// next apply.
	Applied() (uint64, <-chan struct{})
}

// Run adopts the replicated identity whenever the FSM applies one, until
// ctx ends; it returns the first error Adopt gives (ErrOtherCluster: the
// server must stop) or nil when ctx ends.
func (i *Identity) Run(ctx context.Context, st State) error {
	for {
		_, next := st.Applied()
		if id := st.Config().GetClusterId(); id != "" {
			if err := i.Adopt(id); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-next:
		}
	}
}

// Proposer commits one command through Raft (the leader's gate).
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// EnsureMinted gives the cluster an identity if it has none: the leader
// calls it once a term, after the barrier that applied every earlier
// entry. A new cluster's first leader mints one; so does the first leader
// of a cluster from a release before identities, which is how an upgraded
// cluster gets one. A server whose data dir holds an ID the state lacks
// (its state restored from an older snapshot) proposes that one, so the
// cluster keeps the identity its servers already carry.
func EnsureMinted(ctx context.Context, st State, p Proposer, local *Identity, r io.Reader) error {
	cfg := st.Config()
	if cfg.GetClusterId() != "" {
		return nil
	}
	id := local.ID()
	if id == "" {
		var err error
		if id, err = Mint(r); err != nil {
			return err
		}
	}
	cfg.ClusterId = id
	if _, _, err := p.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: cfg}); err != nil {
		return fmt.Errorf("commit cluster id: %w", err)
	}
	return nil
}
