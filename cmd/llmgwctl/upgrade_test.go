package main

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestAssess(t *testing.T) {
	peers := func(lag2, lag3 uint64, healthy3, voter3 bool) []*llmgwv1.RaftPeer {
		return []*llmgwv1.RaftPeer{
			{Id: "c1", Leader: true, Voter: true, Healthy: true, LastIndex: 100, Version: "v0.2.0"},
			{Id: "c2", Voter: true, Healthy: true, LastIndex: 100 - lag2, Version: "v0.2.0"},
			{Id: "c3", Voter: voter3, Healthy: healthy3, LastIndex: 100 - lag3, Version: "v0.1.0"},
		}
	}
	healthy := &llmgwv1.ClusterStatusResponse{Leader: "c1", Healthy: true, FailureTolerance: 1}
	tests := []struct {
		name     string
		st       *llmgwv1.ClusterStatusResponse
		peers    []*llmgwv1.RaftPeer
		problems []string // substrings, in order; none means ok
	}{
		{"ready", healthy, peers(0, 3, true, true), nil},
		{"behind", healthy, peers(40, 0, true, true), []string{"c2 is 40 entries behind"}},
		{"unhealthy server", healthy, peers(0, 0, false, true), []string{"c3 is not healthy"}},
		{"non-voter", healthy, peers(0, 0, true, false), []string{"c3 is not a voter"}},
		{"no tolerance", &llmgwv1.ClusterStatusResponse{Leader: "c1", Healthy: true}, peers(0, 0, true, true), []string{"failure tolerance is 0"}},
		{"no leader", &llmgwv1.ClusterStatusResponse{}, nil, []string{"no leader", "failure tolerance is 0"}},
		{"cluster unhealthy", &llmgwv1.ClusterStatusResponse{Leader: "c1", FailureTolerance: 1}, peers(0, 0, true, true), []string{"unhealthy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := assess(tt.st, tt.peers, nil, 16)
			if r.OK != (len(tt.problems) == 0) || len(r.Problems) != len(tt.problems) {
				t.Fatalf("ok %v problems %q, want %q", r.OK, r.Problems, tt.problems)
			}
			for i, p := range tt.problems {
				if !strings.Contains(r.Problems[i], p) {
					t.Fatalf("problem %d %q, want %q", i, r.Problems[i], p)
				}
			}
		})
	}
	if r := assess(healthy, peers(0, 0, true, true), nil, 16); r.Versions["v0.2.0"] != 2 || r.Versions["v0.1.0"] != 1 {
		t.Fatalf("versions %v", r.Versions)
	}
	// The servers' own answers win over autopilot's (possibly stale) view.
	fresh := []struct {
		name     string
		readings map[string]reading
		problem  string
	}{
		{"all answer", map[string]reading{"c1": {"v0.2.0", "c1", 200}, "c2": {"v0.2.0", "c1", 199}, "c3": {"v0.1.0", "c1", 195}}, ""},
		{"restarted server not back", map[string]reading{"c1": {"v0.2.0", "c1", 200}, "c2": {"v0.2.0", "c1", 200}}, "c3 does not answer"},
		{"restarted server without leader", map[string]reading{"c1": {"v0.2.0", "c1", 200}, "c2": {"v0.2.0", "c1", 200}, "c3": {"v0.2.0", "", 0}}, "c3 does not follow the leader"},
		{"leader's gossip view is stale", map[string]reading{"c1": {"v0.2.0", "c1", 200}, "c2": {"v0.2.0", "c1", 200}, "c3": {"v0.3.0", "c1", 200}}, "the leader does not see c3's version v0.3.0 yet"},
		{"restarted server behind", map[string]reading{"c1": {"v0.2.0", "c1", 200}, "c2": {"v0.2.0", "c1", 200}, "c3": {"v0.1.0", "c1", 100}}, "c3 is 100 entries behind"},
	}
	for _, tt := range fresh {
		r := assess(healthy, peers(0, 0, true, true), tt.readings, 16)
		if (tt.problem == "") != r.OK || (tt.problem != "" && !strings.Contains(strings.Join(r.Problems, ";"), tt.problem)) {
			t.Errorf("%s: ok %v problems %q, want %q", tt.name, r.OK, r.Problems, tt.problem)
		}
		if tt.problem == "" && r.Versions["v0.2.0"] != 2 {
			t.Errorf("%s: versions %v are not the servers' own", tt.name, r.Versions)
		}
	}
}

func TestMakePlan(t *testing.T) {
	st := &llmgwv1.ClusterStatusResponse{Leader: "c1", Servers: []*llmgwv1.ControlServer{
		{Id: "c1", GrpcAddr: "h1:7400", Leader: true, Version: "v0.1.0"},
		{Id: "c3", GrpcAddr: "h3:7400", Version: "v0.1.0"},
		{Id: "c2", GrpcAddr: "h2:7400", Version: "v0.1.0"},
	}}
	tests := []struct {
		name       string
		to         string
		servers    []string
		transferTo string
	}{
		{"all", "", []string{"-", "c2", "c3", "c1"}, "c2"},
		{"c2 already done", "v0.2.0", []string{"-", "c3", "c1"}, "c2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := st
			if tt.to != "" {
				in = &llmgwv1.ClusterStatusResponse{Leader: "c1", Servers: []*llmgwv1.ControlServer{st.Servers[0], st.Servers[1], {Id: "c2", GrpcAddr: "h2:7400", Version: "v0.2.0"}}}
			}
			p, err := makePlan(in, "h1:7400", tt.to)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range p.Steps {
				got = append(got, s.Server)
			}
			if !slices.Equal(got, tt.servers) {
				t.Fatalf("order %v, want %v", got, tt.servers)
			}
			if !strings.Contains(p.Steps[0].Commands[1], "snapshot save") {
				t.Fatalf("the first step is not a snapshot: %v", p.Steps[0].Commands)
			}
			last := p.Steps[len(p.Steps)-1]
			if want := "llmgwctl --addr h2:7400 raft transfer-leadership --to " + tt.transferTo; last.Role != "leader" || last.Commands[0] != want {
				t.Fatalf("leader step %v, want it to start with %q", last.Commands, want)
			}
			for _, s := range p.Steps[1:] {
				if !strings.Contains(s.Commands[len(s.Commands)-1], "upgrade check") {
					t.Fatalf("step %s does not end with the check: %v", s.Server, s.Commands)
				}
			}
		})
	}
	if _, err := makePlan(&llmgwv1.ClusterStatusResponse{}, "h1:7400", ""); err == nil {
		t.Fatal("a plan without a leader")
	}
}

func TestParseLabelArgs(t *testing.T) {
	tests := []struct {
		args   []string
		set    map[string]string
		remove []string
		err    string
	}{
		{args: []string{"zone=b", "gpu=h100", "old-"}, set: map[string]string{"zone": "b", "gpu": "h100"}, remove: []string{"old"}},
		{args: []string{"empty="}, set: map[string]string{"empty": ""}},
		{args: []string{"zone"}, err: "want key=value"},
		{args: []string{"a=1", "a=2"}, err: "given twice"},
		{args: []string{"a=1", "a-"}, err: "both set and removed"},
		{args: []string{"=1"}, err: "must not be empty"},
	}
	for _, tt := range tests {
		set, remove, err := parseLabelArgs("n1", tt.args)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%v: err %v, want %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil || len(set) != len(tt.set) || !slices.Equal(remove, tt.remove) {
			t.Errorf("%v: %v %v %v", tt.args, set, remove, err)
		}
		for k, v := range tt.set {
			if set[k] != v {
				t.Errorf("%v: set %v", tt.args, set)
			}
		}
	}
}

// TestRaftLastIndex: the field when the server sends it, else the header
// of a server older than the field, else 0.
func TestRaftLastIndex(t *testing.T) {
	idx := func(n uint64) *uint64 { return &n }
	tests := []struct {
		name string
		cs   *llmgwv1.ClusterStatusResponse
		md   metadata.MD
		want uint64
	}{
		{"field", &llmgwv1.ClusterStatusResponse{RaftLastIndex: idx(42)}, nil, 42},
		{"field wins over the header", &llmgwv1.ClusterStatusResponse{RaftLastIndex: idx(42)}, metadata.Pairs("llmgw-raft-last-index", "7"), 42},
		{"field set to 0", &llmgwv1.ClusterStatusResponse{RaftLastIndex: idx(0)}, metadata.Pairs("llmgw-raft-last-index", "7"), 0},
		{"old server: header", &llmgwv1.ClusterStatusResponse{}, metadata.Pairs("llmgw-raft-last-index", "7"), 7},
		{"neither", &llmgwv1.ClusterStatusResponse{}, nil, 0},
		{"bad header", &llmgwv1.ClusterStatusResponse{}, metadata.Pairs("llmgw-raft-last-index", "x"), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := raftLastIndex(tt.cs, tt.md); got != tt.want {
				t.Fatalf("raftLastIndex = %d, want %d", got, tt.want)
			}
		})
	}
}
