package fsm

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// SnapshotFormat is the version of State this build writes. Restore refuses
// a newer one rather than drop fields it does not know (design §4).
const SnapshotFormat = 1

// DefaultChangeLogSize is how many changes the FSM keeps for watchers to
// resume from. A watcher further behind gets a framed snapshot instead, which
// is correct, only bigger.
const DefaultChangeLogSize = 8192

// Config tunes an FSM. The zero value is valid (documented defaults).
type Config struct {
	// ChangeLogSize bounds the in-memory change log; 0 means
	// DefaultChangeLogSize.
	ChangeLogSize int
}

// FSM holds the desired state and applies commands to it. Apply, Snapshot
// and Restore are called by one goroutine (raft's); every read accessor is
// safe to call concurrently with them and returns copies the caller owns.
type FSM struct {
	maxLog int

	mu       sync.RWMutex
	revision uint64
	models   map[string]*llmgwv1.Model
	nodes    map[string]*llmgwv1.Node
	// replicas is added to and deleted from only through putReplica and
	// dropReplica, which keep index (replicaindex.go); a record may be
	// replaced in place when its node and model stay.
	replicas map[string]*llmgwv1.Replica
	index    replicaIndex
	config   *llmgwv1.ClusterConfig
	ordinals map[string]uint64
	// adapters holds the adapter placements by adapter name (names are
	// unique across models, design §4).
	adapters map[string]*llmgwv1.AdapterPlacement
	// removals holds the removal records of control-plane servers by
	// server id (servers.go).
	removals map[string]*llmgwv1.ServerRemoval
	// apiKeys holds the router API keys by name (apikeys.go).
	apiKeys map[string]*llmgwv1.ApiKey
	// tenants, the usage roll-up and its cursors (tenants.go); usageNewest
	// is the newest hour any batch carried, the retention's reference.
	tenants      map[string]*llmgwv1.Tenant
	usage        map[usageKey]*llmgwv1.UsageRow
	usageCursors map[cursorKey]*llmgwv1.UsageCursor
	usageNewest  int64
	// aliases holds the model aliases by name (aliases.go).
	aliases map[string]*llmgwv1.Alias
	// scales holds the autoscaler's counts by model (scale.go).
	scales map[string]*llmgwv1.ModelScale
	log    []*llmgwv1.Change
	// logFloor is the newest revision the log no longer covers: changes
	// after it are all in the log.
	logFloor uint64
	// applied is closed (and replaced) whenever the revision moves, so
	// watchers wait without polling.
	applied chan struct{}
}

// New returns an empty FSM at revision 0.
func New(cfg Config) *FSM {
	n := cfg.ChangeLogSize
	if n <= 0 {
		n = DefaultChangeLogSize
	}
	f := &FSM{maxLog: n, applied: make(chan struct{})}
	f.reset()
	return f
}

func (f *FSM) reset() {
	f.revision = 0
	f.models = map[string]*llmgwv1.Model{}
	f.nodes = map[string]*llmgwv1.Node{}
	f.replicas = map[string]*llmgwv1.Replica{}
	f.index = newReplicaIndex()
	f.config = &llmgwv1.ClusterConfig{}
	f.ordinals = map[string]uint64{}
	f.adapters = map[string]*llmgwv1.AdapterPlacement{}
	f.removals = map[string]*llmgwv1.ServerRemoval{}
	f.apiKeys = map[string]*llmgwv1.ApiKey{}
	f.tenants = map[string]*llmgwv1.Tenant{}
	f.usage = map[usageKey]*llmgwv1.UsageRow{}
	f.usageCursors = map[cursorKey]*llmgwv1.UsageCursor{}
	f.usageNewest = 0
	f.scales = map[string]*llmgwv1.ModelScale{}
	f.aliases = map[string]*llmgwv1.Alias{}
	f.log = nil
	f.logFloor = 0
}

// Apply applies one log entry at index, which becomes the revision. The
// result is the object the command produced (the stored *Model, the placed
// *Replica, ...) or nil. An error rejects the command and leaves the state as
// it was, except that the revision still moves to index; IsFatal(err) means
// the node must stop (an unknown non-ignorable command).
func (f *FSM) Apply(index uint64, data []byte) (any, error) {
	return f.ApplyAt(index, 0, data)
}

// ApplyAt is Apply for an entry appended at appendedUnix (Unix seconds of
// the Raft log's AppendedAt, the same on every node, so applying stays
// deterministic): a model's created_unix is taken from it when the model
// is first applied. 0 (unknown) leaves created_unix 0.
func (f *FSM) ApplyAt(index uint64, appendedUnix int64, data []byte) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if index <= f.revision {
		// Raft never re-applies an index; refusing protects the revision
		// invariant against a caller that would.
		return nil, fmt.Errorf("apply index %d: already at revision %d", index, f.revision)
	}
	f.revision = index
	defer f.notify()

	var cmd llmgwv1.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return nil, fmt.Errorf("apply index %d: %w: %w", index, ErrMalformed, err)
	}
	known, ok := knownCommand(cmd.Type)
	if !ok || cmd.Version > known || cmd.Version == 0 {
		if cmd.Ignorable {
			return nil, nil
		}
		return nil, fmt.Errorf("apply index %d: %w", index, &UnknownCommandError{Type: cmd.Type, Version: cmd.Version})
	}
	payload := payloadFor(cmd.Type)
	if err := proto.Unmarshal(cmd.Payload, payload); err != nil {
		return nil, fmt.Errorf("apply index %d %s: %w: %w", index, cmd.Type, ErrMalformed, err)
	}
	a := applier{f: f, index: index, at: appendedUnix}
	var res any
	var err error
	switch p := payload.(type) {
	case *llmgwv1.UpsertModelCommand:
		res, err = a.upsertModel(p)
	case *llmgwv1.DeleteModelCommand:
		res, err = a.deleteModel(p)
	case *llmgwv1.RegisterNodeCommand:
		res, err = a.registerNode(p)
	case *llmgwv1.SetNodeStateCommand:
		res, err = a.setNodeState(p)
	case *llmgwv1.PlaceReplicaCommand:
		res, err = a.placeReplica(p)
	case *llmgwv1.RemoveReplicaCommand:
		res, err = a.removeReplica(p)
	case *llmgwv1.SetReplicaDrainingCommand:
		res, err = a.setReplicaDraining(p)
	case *llmgwv1.SetClusterConfigCommand:
		res, err = a.setClusterConfig(p)
	case *llmgwv1.SetAdapterPlacementCommand:
		res, err = a.setAdapterPlacement(p)
	case *llmgwv1.SetNodeLabelsCommand:
		res, err = a.setNodeLabels(p)
	case *llmgwv1.SetServerRemovedCommand:
		res, err = a.setServerRemoved(p)
	case *llmgwv1.PutApiKeyCommand:
		res, err = a.putAPIKey(p)
	case *llmgwv1.DeleteApiKeyCommand:
		res, err = a.deleteAPIKey(p)
	case *llmgwv1.SetApiKeysRequiredCommand:
		res, err = a.setAPIKeysRequired(p)
	case *llmgwv1.PutTenantCommand:
		res, err = a.putTenant(p)
	case *llmgwv1.DeleteTenantCommand:
		res, err = a.deleteTenant(p)
	case *llmgwv1.SetApiKeyTenantCommand:
		res, err = a.setAPIKeyTenant(p)
	case *llmgwv1.RecordUsageCommand:
		res, err = a.recordUsage(p)
	case *llmgwv1.SetModelScaleCommand:
		res, err = a.setModelScale(p)
	case *llmgwv1.SetReplicaSleepingCommand:
		res, err = a.setReplicaSleeping(p)
	case *llmgwv1.PutAliasCommand:
		res, err = a.putAlias(p)
	case *llmgwv1.DeleteAliasCommand:
		res, err = a.deleteAlias(p)
	}
	if err != nil {
		return nil, fmt.Errorf("apply index %d %s: %w", index, cmd.Type, err)
	}
	f.appendLog(a.changes)
	return res, nil
}

func (f *FSM) notify() {
	close(f.applied)
	f.applied = make(chan struct{})
}

func (f *FSM) appendLog(changes []*llmgwv1.Change) {
	f.log = append(f.log, changes...)
	if over := len(f.log) - f.maxLog; over > 0 {
		f.logFloor = f.log[over-1].Revision
		// Copy so the dropped prefix is not kept alive by the backing array.
		f.log = slices.Clone(f.log[over:])
	}
}

// applier carries one command's index and collects the changes it makes.
// Each method validates fully before it mutates, so a rejected command
// changes nothing.
type applier struct {
	f       *FSM
	index   uint64
	at      int64 // the entry's append time, Unix seconds; 0 when unknown
	changes []*llmgwv1.Change
}

func (a *applier) put(obj proto.Message) {
	c := &llmgwv1.Change{Revision: a.index, Op: llmgwv1.ChangeOp_CHANGE_OP_PUT}
	setObject(c, proto.Clone(obj))
	a.changes = append(a.changes, c)
}

func (a *applier) del(obj proto.Message) {
	c := &llmgwv1.Change{Revision: a.index, Op: llmgwv1.ChangeOp_CHANGE_OP_DELETE}
	setObject(c, obj)
	a.changes = append(a.changes, c)
}

func setObject(c *llmgwv1.Change, obj proto.Message) {
	switch o := obj.(type) {
	case *llmgwv1.Model:
		c.Object = &llmgwv1.Change_Model{Model: o}
	case *llmgwv1.Node:
		c.Object = &llmgwv1.Change_Node{Node: o}
	case *llmgwv1.Replica:
		c.Object = &llmgwv1.Change_Replica{Replica: o}
	case *llmgwv1.ClusterConfig:
		c.Object = &llmgwv1.Change_Config{Config: o}
	case *llmgwv1.AdapterPlacement:
		c.Object = &llmgwv1.Change_AdapterPlacement{AdapterPlacement: o}
	case *llmgwv1.ApiKey:
		c.Object = &llmgwv1.Change_ApiKey{ApiKey: o}
	case *llmgwv1.Tenant:
		c.Object = &llmgwv1.Change_Tenant{Tenant: o}
	case *llmgwv1.Alias:
		c.Object = &llmgwv1.Change_Alias{Alias: o}
	}
}

func (a *applier) upsertModel(p *llmgwv1.UpsertModelCommand) (any, error) {
	if p.Model == nil {
		return nil, invalid("model", "required")
	}
	m := ModelDefaults(ClusterDefaults(p.Model, a.f.config))
	if err := validateApplied(m); err != nil {
		return nil, err
	}
	// Adapters share the OpenAI "model" namespace with models (design §4), so
	// a name may be used once across the cluster.
	owners := map[string]string{}
	for _, other := range a.f.models {
		if other.Name == m.Name {
			continue
		}
		owners[other.Name] = other.Name
		for _, ad := range other.Adapters {
			owners[ad.Name] = other.Name
		}
	}
	if owner, ok := owners[m.Name]; ok && owner != m.Name {
		return nil, invalid("name", "%q is an adapter of model %q", m.Name, owner)
	}
	for i, ad := range m.Adapters {
		if owner, ok := owners[ad.Name]; ok {
			return nil, invalid(fmt.Sprintf("adapters[%d].name", i), "%q is already used by model %q", ad.Name, owner)
		}
	}
	if err := a.modelNameFree(m); err != nil {
		return nil, err
	}
	// Revision moves only when what the replicas run changes, so placement
	// rolls them exactly then (design §4 "Changes roll"); a new replica count
	// or routing setting keeps it.
	// created_unix is the model's first apply, whatever the command says:
	// /v1/models reports it as the model's creation time.
	m.CreatedUnix = a.at
	m.Revision = a.index
	if old, ok := a.f.models[m.Name]; ok {
		m.CreatedUnix = old.CreatedUnix
		if !NeedsRestart(old, m) {
			m.Revision = old.Revision
		}
	}
	a.f.models[m.Name] = m
	if m.Autoscale == nil {
		delete(a.f.scales, m.Name) // a fixed count again
	}
	a.put(m)
	a.fitAdapterPlacements(m)
	return proto.Clone(m), nil
}

func (a *applier) deleteModel(p *llmgwv1.DeleteModelCommand) (any, error) {
	m, ok := a.f.models[p.Name]
	if !ok {
		return nil, fmt.Errorf("model %q: %w", p.Name, ErrNotFound)
	}
	// Its adapter placements and replicas go in the same command, so no
	// revision ever shows a replica of a model that does not exist.
	for _, p := range sortedValues(a.f.adapters, func(p *llmgwv1.AdapterPlacement) string { return p.Adapter }) {
		if p.Model == m.Name {
			a.dropPlacement(p.Adapter)
		}
	}
	for _, id := range a.f.index.ofModel(m.Name) {
		r := a.f.replicas[id]
		a.f.dropReplica(id)
		a.del(&llmgwv1.Replica{Id: r.Id, Uid: r.Uid, Model: r.Model, Node: r.Node})
	}
	delete(a.f.models, m.Name)
	delete(a.f.ordinals, m.Name)
	delete(a.f.scales, m.Name)
	a.del(&llmgwv1.Model{Name: m.Name})
	return nil, nil
}

func (a *applier) registerNode(p *llmgwv1.RegisterNodeCommand) (any, error) {
	if p.Node == nil || p.Node.Id == "" {
		return nil, invalid("node.id", "required")
	}
	n := proto.Clone(p.Node).(*llmgwv1.Node)
	if n.State == llmgwv1.NodeState_NODE_STATE_UNSPECIFIED {
		// Re-registering keeps an operator's draining; a new node starts
		// active.
		n.State = llmgwv1.NodeState_NODE_STATE_ACTIVE
		if old, ok := a.f.nodes[n.Id]; ok {
			n.State = old.State
		}
	}
	// An operator's labels outlive the agent's re-registration (at every
	// reattach): the agent's configured labels no longer apply.
	if old, ok := a.f.nodes[n.Id]; ok && old.LabelsByOperator {
		n.Labels = maps.Clone(old.Labels)
		n.LabelsByOperator = true
	}
	n.Revision = a.index
	a.f.nodes[n.Id] = n
	a.put(n)
	return proto.Clone(n), nil
}

func (a *applier) setNodeState(p *llmgwv1.SetNodeStateCommand) (any, error) {
	n, ok := a.f.nodes[p.Id]
	if !ok {
		return nil, fmt.Errorf("node %q: %w", p.Id, ErrNotFound)
	}
	if _, ok := llmgwv1.NodeState_name[int32(p.State)]; !ok || p.State == llmgwv1.NodeState_NODE_STATE_UNSPECIFIED {
		return nil, invalid("state", "must be active, draining or down")
	}
	n = proto.Clone(n).(*llmgwv1.Node)
	n.State = p.State
	n.Revision = a.index
	a.f.nodes[n.Id] = n
	a.put(n)
	return proto.Clone(n), nil
}

// placeReplica places a new replica (empty id: the FSM names it
// <model>-<ordinal>) or re-places an existing one. Either way its uid becomes
// this entry's index, so everything keyed by the old placement is dropped.
func (a *applier) placeReplica(p *llmgwv1.PlaceReplicaCommand) (any, error) {
	if p.Replica == nil {
		return nil, invalid("replica", "required")
	}
	r := proto.Clone(p.Replica).(*llmgwv1.Replica)
	if _, ok := a.f.models[r.Model]; !ok {
		return nil, fmt.Errorf("replica of model %q: %w", r.Model, ErrNotFound)
	}
	node, ok := a.f.nodes[r.Node]
	if !ok {
		return nil, fmt.Errorf("replica on node %q: %w", r.Node, ErrNotFound)
	}
	if err := checkReplicaEndpoint(r, a.f.models[r.Model]); err != nil {
		return nil, err
	}
	var newOrdinal uint64
	if r.Id == "" {
		newOrdinal = a.f.ordinals[r.Model]
		r.Id = r.Model + "-" + strconv.FormatUint(newOrdinal, 10)
	} else if old, ok := a.f.replicas[r.Id]; !ok {
		return nil, fmt.Errorf("replica %q: %w (omit the id to place a new one)", r.Id, ErrNotFound)
	} else if old.Model != r.Model {
		return nil, fmt.Errorf("replica %q belongs to model %q, not %q: %w", r.Id, old.Model, r.Model, ErrConflict)
	}
	if err := a.f.checkGPUs(r, node); err != nil {
		return nil, err
	}
	if r.Weight == 0 {
		r.Weight = 1
	}
	if len(r.Shards) == 0 {
		r.Shards = []*llmgwv1.Shard{{Node: r.Node, Rank: 0}}
	}
	r.Uid = a.index
	r.Revision = a.index
	r.Draining = false
	// What the replica runs is the model as of now; a later re-apply that
	// needs a restart rolls it (placement compares the two).
	r.ModelRevision = a.f.models[r.Model].GetRevision()
	if p.Replica.Id == "" {
		a.f.ordinals[r.Model] = newOrdinal + 1
	}
	a.f.putReplica(r)
	a.put(r)
	return proto.Clone(r), nil
}

// checkGPUs refuses a placement of r on node whose GPU indices do not
// exist there, repeat, or are held by an awake replica other than r. A
// GPU whose every holder sleeps is free (design §5.7 "Sharing GPUs": a
// sleeping vLLM has given its memory back), so another replica may be
// placed on it. It reads only the node's replicas (the index).
func (f *FSM) checkGPUs(r *llmgwv1.Replica, node *llmgwv1.Node) error {
	held := map[uint32]string{} // GPU → the first awake holder, by id
	for _, id := range f.index.onNode(r.Node) {
		o := f.replicas[id]
		if o.Id == r.Id || o.Sleeping {
			continue
		}
		for _, g := range o.GpuIndices {
			if _, ok := held[g]; !ok {
				held[g] = o.Id
			}
		}
	}
	seen := map[uint32]bool{}
	for _, g := range r.GpuIndices {
		if g >= node.Gpus {
			return fmt.Errorf("replica %q: GPU %d does not exist on node %q (%d GPUs): %w", r.Id, g, r.Node, node.Gpus, ErrConflict)
		}
		if holder, ok := held[g]; ok || seen[g] {
			return fmt.Errorf("replica %q: GPU %d on node %q is already given to %q: %w", r.Id, g, r.Node, holder, ErrConflict)
		}
		seen[g] = true
	}
	return nil
}

// checkReplicaEndpoint holds the replica record of an external engine
// (design §5.5): it stands for one of its model's endpoints and holds no
// GPUs, since nothing runs on its node (the agent there only probes the
// engine). A replica of any other engine names no endpoint.
func checkReplicaEndpoint(r *llmgwv1.Replica, m *llmgwv1.Model) error {
	if m.GetEngine() != "external" {
		if r.Endpoint != "" {
			return invalid("replica.endpoint", "only replicas of engine \"external\" name an endpoint; model %q runs engine %q", m.GetName(), m.GetEngine())
		}
		return nil
	}
	if !slices.Contains(m.GetEndpoints(), r.Endpoint) {
		return invalid("replica.endpoint", "%q is not one of model %q's endpoints", r.Endpoint, m.GetName())
	}
	if len(r.GpuIndices) > 0 {
		return invalid("replica.gpu_indices", "a replica of engine \"external\" holds no GPUs")
	}
	return nil
}

func (a *applier) removeReplica(p *llmgwv1.RemoveReplicaCommand) (any, error) {
	r, ok := a.f.replicas[p.Id]
	if !ok || r.Uid != p.Uid {
		return nil, nil // an older placement's remove: nothing left to do
	}
	a.dropReplicaFromPlacements(r.Id)
	a.f.dropReplica(r.Id)
	a.del(&llmgwv1.Replica{Id: r.Id, Uid: r.Uid, Model: r.Model, Node: r.Node})
	return nil, nil
}

func (a *applier) setReplicaDraining(p *llmgwv1.SetReplicaDrainingCommand) (any, error) {
	r, ok := a.f.replicas[p.Id]
	if !ok || r.Uid != p.Uid || r.Draining {
		return nil, nil
	}
	r = proto.Clone(r).(*llmgwv1.Replica)
	r.Draining = true
	r.Revision = a.index
	a.f.replicas[r.Id] = r
	a.put(r)
	return proto.Clone(r), nil
}

func (a *applier) setClusterConfig(p *llmgwv1.SetClusterConfigCommand) (any, error) {
	c := &llmgwv1.ClusterConfig{}
	if p.Config != nil {
		c = proto.Clone(p.Config).(*llmgwv1.ClusterConfig)
	}
	if c.DefaultHashSeed != "" && !validHashSeed(c.DefaultHashSeed) {
		return nil, invalid("default_hash_seed", "must be a decimal in 0..4294967295, got %q", c.DefaultHashSeed)
	}
	if c.DefaultBlockSize != 0 && !slices.Contains(BlockSizes, c.DefaultBlockSize) {
		return nil, invalid("default_block_size", "must be one of %s, got %d", uintList(BlockSizes), c.DefaultBlockSize)
	}
	// The minimum version ratchets up only (design §13.3): once a gated
	// command may be in the log, no later write lets older servers back.
	if old := a.f.config.GetMinVersion(); old != "" && CompareVersions(c.MinVersion, old) < 0 {
		c.MinVersion = old
	}
	// So does the API key requirement (apikeys.go): no config write turns
	// the routers' check off once a key has existed.
	c.ApiKeysRequired = c.ApiKeysRequired || a.f.config.GetApiKeysRequired()
	// The cluster's identity is set once and never changes (design §5.2
	// "Cluster identity"): every server's data dir and handshake carry it,
	// so a write that changed it would cut the cluster off from itself. A
	// write without one (a config set by a server that predates it, or
	// that read the config before it was minted) keeps it.
	if old := a.f.config.GetClusterId(); old != "" {
		if c.ClusterId != "" && c.ClusterId != old {
			return nil, invalid("cluster_id", "is %s and never changes, got %s", old, c.ClusterId)
		}
		c.ClusterId = old
	} else if c.ClusterId != "" && !ValidClusterID(c.ClusterId) {
		return nil, invalid("cluster_id", "must be 32 lowercase hex digits, got %q", c.ClusterId)
	}
	c.Revision = a.index
	a.f.config = c
	a.put(c)
	return proto.Clone(c), nil
}

// NeedsRestart reports whether replicas of model old must restart to run
// model new: anything changed but the replica count, the routing settings
// (profile, overrides) and the placement rules (node selector, which
// placement applies by moving replicas itself). Revisions are ignored.
func NeedsRestart(old, new *llmgwv1.Model) bool {
	strip := func(m *llmgwv1.Model) *llmgwv1.Model {
		c := proto.Clone(m).(*llmgwv1.Model)
		c.Replicas, c.Profile, c.ProfileOverrides, c.NodeSelector, c.Revision, c.CreatedUnix = 0, "", nil, nil, 0, 0
		// How many run and who gives way is placement's; only sleep mode
		// is an engine flag (design §5.7).
		c.Priority, c.Pinned = 0, false
		if c.Autoscale != nil {
			c.Autoscale = &llmgwv1.Autoscale{Sleep: c.Autoscale.Sleep}
		}
		return c
	}
	return !proto.Equal(strip(old), strip(new))
}

// ClusterDefaults returns a copy of m with the cluster-wide defaults of c
// filled in where m leaves them unset (design §4 ClusterConfig): they take
// precedence over ModelDefaults' built-in ones. Only kv_events models get a
// block size from it, as ModelDefaults does.
func ClusterDefaults(m *llmgwv1.Model, c *llmgwv1.ClusterConfig) *llmgwv1.Model {
	out := proto.Clone(m).(*llmgwv1.Model)
	if out.HashSeed == "" {
		out.HashSeed = c.GetDefaultHashSeed()
	}
	if out.KvEvents && out.BlockSize == 0 {
		out.BlockSize = c.GetDefaultBlockSize()
	}
	return out
}

// Config returns a copy of the cluster configuration.
func (f *FSM) Config() *llmgwv1.ClusterConfig {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return proto.Clone(f.config).(*llmgwv1.ClusterConfig)
}

// Snapshot returns the whole state, deterministically marshaled with every
// list sorted, so two FSMs with the same history give identical bytes.
func (f *FSM) Snapshot() ([]byte, error) {
	st := f.State()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("snapshot at revision %d: %w", st.Revision, err)
	}
	return b, nil
}

// Restore replaces the state with a snapshot's. The change log restarts
// empty at the snapshot's revision: a watcher from before it gets a snapshot.
func (f *FSM) Restore(data []byte) error {
	var st llmgwv1.State
	if err := proto.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("restore: %w: %w", ErrMalformed, err)
	}
	if st.Format == 0 || st.Format > SnapshotFormat {
		return fmt.Errorf("restore: snapshot format %d is not known to this build (knows up to %d): %w", st.Format, SnapshotFormat, ErrUnknownCommand)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A cluster keeps its identity through a restore (design §5.2
	// "Cluster identity"): every server's data dir and handshake carry it,
	// so a backup taken before identities, or one brought from another
	// cluster onto this one, must not swap it. A server starting empty
	// takes the snapshot's.
	held := f.config.GetClusterId()
	f.reset()
	f.revision = st.Revision
	f.logFloor = st.Revision
	for _, m := range st.Models {
		f.models[m.Name] = m
	}
	for _, n := range st.Nodes {
		f.nodes[n.Id] = n
	}
	for _, r := range st.Replicas {
		f.putReplica(r)
	}
	if st.Config != nil {
		f.config = st.Config
	}
	if held != "" {
		f.config.ClusterId = held
	}
	for k, v := range st.NextOrdinal {
		f.ordinals[k] = v
	}
	for _, p := range st.AdapterPlacements {
		f.adapters[p.Adapter] = p
	}
	for _, r := range st.ServerRemovals {
		f.removals[r.ServerId] = r
	}
	for _, k := range st.ApiKeys {
		f.apiKeys[k.Name] = k
	}
	for _, t := range st.Tenants {
		f.tenants[t.Name] = t
	}
	f.restoreUsage(&st)
	f.restoreScales(&st)
	for _, a := range st.Aliases {
		f.aliases[a.Name] = a
	}
	f.notify()
	return nil
}

// State returns a copy of the whole state at one revision, lists sorted.
func (f *FSM) State() *llmgwv1.State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	st := &llmgwv1.State{
		Format:            SnapshotFormat,
		Revision:          f.revision,
		Models:            cloneSorted(f.models, func(m *llmgwv1.Model) string { return m.Name }),
		Nodes:             cloneSorted(f.nodes, func(n *llmgwv1.Node) string { return n.Id }),
		Replicas:          cloneSorted(f.replicas, func(r *llmgwv1.Replica) string { return r.Id }),
		Config:            proto.Clone(f.config).(*llmgwv1.ClusterConfig),
		NextOrdinal:       map[string]uint64{},
		AdapterPlacements: cloneSorted(f.adapters, func(p *llmgwv1.AdapterPlacement) string { return p.Adapter }),
		ServerRemovals:    cloneSorted(f.removals, func(r *llmgwv1.ServerRemoval) string { return r.ServerId }),
		ApiKeys:           cloneSorted(f.apiKeys, func(k *llmgwv1.ApiKey) string { return k.Name }),
		Tenants:           cloneSorted(f.tenants, func(t *llmgwv1.Tenant) string { return t.Name }),
		Aliases:           cloneSorted(f.aliases, func(a *llmgwv1.Alias) string { return a.Name }),
	}
	st.Usage, st.UsageCursors = f.usageState()
	st.Scales = f.scaleState()
	for k, v := range f.ordinals {
		st.NextOrdinal[k] = v
	}
	return st
}

// Revision is the index of the last applied entry.
func (f *FSM) Revision() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.revision
}

// Applied returns the current revision and a channel closed at the next
// apply or restore. Waiters read the revision, and if it is not what they
// want, wait on the channel and ask again.
func (f *FSM) Applied() (uint64, <-chan struct{}) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.revision, f.applied
}

// ChangesSince returns copies of the changes with a revision above rev, in
// order. ok is false when the log no longer reaches back to rev: the caller
// must send a snapshot instead.
func (f *FSM) ChangesSince(rev uint64) (changes []*llmgwv1.Change, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if rev < f.logFloor {
		return nil, false
	}
	i, _ := slices.BinarySearchFunc(f.log, rev+1, func(c *llmgwv1.Change, r uint64) int { return cmp.Compare(c.Revision, r) })
	out := make([]*llmgwv1.Change, 0, len(f.log)-i)
	for _, c := range f.log[i:] {
		out = append(out, proto.Clone(c).(*llmgwv1.Change))
	}
	return out, true
}

// Model returns a copy of the named model.
func (f *FSM) Model(name string) (*llmgwv1.Model, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.models[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(m).(*llmgwv1.Model), true
}

// Replica returns a copy of the replica with this id.
func (f *FSM) Replica(id string) (*llmgwv1.Replica, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.replicas[id]
	if !ok {
		return nil, false
	}
	return proto.Clone(r).(*llmgwv1.Replica), true
}

// Node returns a copy of the node with this id.
func (f *FSM) Node(id string) (*llmgwv1.Node, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, ok := f.nodes[id]
	if !ok {
		return nil, false
	}
	return proto.Clone(n).(*llmgwv1.Node), true
}

// NodeDesired returns what one node should run: its replicas (sorted by id),
// the models they belong to and the adapter placements naming any of them
// (sorted by adapter), at one revision. Every agent session reads it at
// every applied entry, so it costs the node's replicas (the index) and the
// adapter placements, never a pass over every replica.
func (f *FSM) NodeDesired(node string) *llmgwv1.DesiredReplicas {
	f.mu.RLock()
	defer f.mu.RUnlock()
	d := &llmgwv1.DesiredReplicas{Revision: f.revision}
	ids := f.index.onNode(node)
	var names []string
	for _, id := range ids {
		r := f.replicas[id]
		d.Replicas = append(d.Replicas, proto.Clone(r).(*llmgwv1.Replica))
		if _, ok := f.models[r.Model]; ok && !slices.Contains(names, r.Model) {
			names = append(names, r.Model)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		d.Models = append(d.Models, proto.Clone(f.models[name]).(*llmgwv1.Model))
	}
	if len(ids) == 0 || len(f.adapters) == 0 {
		return d
	}
	here := f.index.byNode[node]
	for _, p := range f.adapters {
		if slices.ContainsFunc(p.Replicas, func(id string) bool { _, ok := here[id]; return ok }) {
			d.Adapters = append(d.Adapters, proto.Clone(p).(*llmgwv1.AdapterPlacement))
		}
	}
	slices.SortFunc(d.Adapters, func(a, b *llmgwv1.AdapterPlacement) int { return cmp.Compare(a.Adapter, b.Adapter) })
	return d
}

func sortedValues[T any](m map[string]T, key func(T) string) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return out
}

func cloneSorted[T proto.Message](m map[string]T, key func(T) string) []T {
	out := sortedValues(m, key)
	for i, v := range out {
		out[i] = proto.Clone(v).(T)
	}
	return out
}
