package gossip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/fsm"
)

// Meta is what a control server tells the others about itself over gossip
// (design §5.4): enough to add it to Raft, to forward to it, and to check
// that every server was started with the same bootstrap expectation. It
// travels as memberlist node metadata, which is capped at 512 bytes.
type Meta struct {
	ID      string `json:"id"`
	Version string `json:"v,omitempty"`
	GRPC    string `json:"g"`
	Raft    string `json:"r"`
	HTTP    string `json:"h,omitempty"`
	// Expect is --bootstrap-expect; Bootstrap is --bootstrap (a single-node
	// start, which no expectation matches).
	Expect    int  `json:"e,omitempty"`
	Bootstrap bool `json:"b,omitempty"`
	// Cluster is the cluster's identity as this server knows it, empty
	// before it has one (design §5.2 "Cluster identity"). Two servers
	// that both know one and differ are of two clusters: gossip refuses
	// to merge them.
	Cluster string `json:"c,omitempty"`
}

// Encode is the metadata as memberlist carries it; an error when it would
// exceed memberlist's limit.
func (m Meta) Encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip metadata is %d bytes, over memberlist's %d: shorten --node-id or the addresses", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// DecodeMeta reads another server's metadata: outside input, so a bad one
// is an error the caller logs, never a crash.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, errors.New("no metadata")
	}
	if len(b) > memberlist.MetaMaxSize {
		return m, fmt.Errorf("metadata of %d bytes exceeds %d", len(b), memberlist.MetaMaxSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("decode metadata: %w", err)
	}
	if m.ID == "" || m.Raft == "" || m.GRPC == "" {
		return m, errors.New("metadata lacks id, raft or grpc address")
	}
	if m.Cluster != "" && !fsm.ValidClusterID(m.Cluster) {
		return m, fmt.Errorf("metadata cluster id %q is not a cluster id", m.Cluster)
	}
	if m.Expect < 0 {
		return m, fmt.Errorf("bootstrap expect %d is negative", m.Expect)
	}
	return m, nil
}

// Status is a server's gossip status as Members reports it.
type Status string

const (
	StatusAlive   Status = "alive"
	StatusSuspect Status = "suspect"
	StatusDead    Status = "dead"
	StatusLeft    Status = "left"
)

// Live reports whether the status counts as a running server (alive, or
// suspected but not yet declared dead).
func (s Status) Live() bool { return s == StatusAlive || s == StatusSuspect }

// Member is one control server as gossip knows it.
type Member struct {
	Meta       Meta
	GossipAddr string
	Status     Status
}

// SortedIDs returns the ids of ms in order.
func SortedIDs(ms map[string]Member) []string {
	ids := make([]string, 0, len(ms))
	for id := range ms {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
