package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeAdmin answers the server and raft verbs from canned values and records
// what it was asked, so the CLI is tested without a cluster.
type fakeAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer

	mu    sync.Mutex
	calls []string
	join  *llmgwv1.JoinRequest
	to    string
	// err, when set, is returned by every call.
	err error

	joined    int32
	newLeader string
	members   []*llmgwv1.Member
	peers     []*llmgwv1.RaftPeer
	status    *llmgwv1.ClusterStatusResponse
	known     map[string]bool
}

func (f *fakeAdmin) record(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return f.err
}

func (f *fakeAdmin) Join(_ context.Context, r *llmgwv1.JoinRequest) (*llmgwv1.JoinResponse, error) {
	if err := f.record("Join"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.join = r
	f.mu.Unlock()
	return &llmgwv1.JoinResponse{Joined: f.joined}, nil
}

func (f *fakeAdmin) Leave(context.Context, *llmgwv1.LeaveRequest) (*llmgwv1.LeaveResponse, error) {
	if err := f.record("Leave"); err != nil {
		return nil, err
	}
	return &llmgwv1.LeaveResponse{NewLeader: f.newLeader}, nil
}

func (f *fakeAdmin) Members(context.Context, *llmgwv1.MembersRequest) (*llmgwv1.MembersResponse, error) {
	if err := f.record("Members"); err != nil {
		return nil, err
	}
	return &llmgwv1.MembersResponse{Members: f.members}, nil
}

func (f *fakeAdmin) ListPeers(context.Context, *llmgwv1.ListPeersRequest) (*llmgwv1.ListPeersResponse, error) {
	if err := f.record("ListPeers"); err != nil {
		return nil, err
	}
	return &llmgwv1.ListPeersResponse{Peers: f.peers}, nil
}

func (f *fakeAdmin) RemovePeer(_ context.Context, r *llmgwv1.RemovePeerRequest) (*llmgwv1.RemovePeerResponse, error) {
	if err := f.record("RemovePeer " + r.Id); err != nil {
		return nil, err
	}
	if !f.known[r.Id] {
		return nil, status.Errorf(codes.NotFound, "remove peer: %s is not in the Raft configuration", r.Id)
	}
	return &llmgwv1.RemovePeerResponse{}, nil
}

func (f *fakeAdmin) TransferLeadership(_ context.Context, r *llmgwv1.TransferLeadershipRequest) (*llmgwv1.TransferLeadershipResponse, error) {
	if err := f.record("TransferLeadership"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.to = r.To
	f.mu.Unlock()
	leader := r.To
	if leader == "" {
		leader = "c2"
	}
	return &llmgwv1.TransferLeadershipResponse{Leader: leader}, nil
}

func (f *fakeAdmin) ClusterStatus(context.Context, *llmgwv1.ClusterStatusRequest) (*llmgwv1.ClusterStatusResponse, error) {
	if err := f.record("ClusterStatus"); err != nil {
		return nil, err
	}
	return f.status, nil
}

// serveFake serves f on a loopback port until the test ends.
func serveFake(t *testing.T, f *fakeAdmin) string {
	t.Helper()
	return serveAdmin(t, f)
}

// serveAdmin serves any AdminService on a loopback port until the test
// ends.
func serveAdmin(t *testing.T, a llmgwv1.AdminServiceServer) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	llmgwv1.RegisterAdminServiceServer(srv, a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return l.Addr().String()
}

// run runs llmgwctl with args against addr and returns its output.
func run(addr string, args ...string) (string, error) {
	var out bytes.Buffer
	root := newRootCmd(&out)
	root.SetArgs(append([]string{"--addr", addr}, args...))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

func newFake() *fakeAdmin {
	return &fakeAdmin{
		joined:    2,
		newLeader: "c2",
		members: []*llmgwv1.Member{
			{Id: "c2", GossipAddr: "10.0.0.2:7402", GrpcAddr: "10.0.0.2:7400", RaftAddr: "10.0.0.2:7401", Version: "v0.2.0", Status: "alive", BootstrapExpect: 3},
			{Id: "c1", GossipAddr: "10.0.0.1:7402", GrpcAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", Version: "v0.2.0", Status: "alive", BootstrapExpect: 3},
			{Id: "c4", GossipAddr: "10.0.0.4:7402", Status: "left"},
		},
		peers: []*llmgwv1.RaftPeer{
			{Id: "c3", Address: "10.0.0.3:7401", Healthy: true, LastContactMs: 12, LastIndex: 40, StableSeconds: 3, Version: "v0.2.0"},
			{Id: "c1", Address: "10.0.0.1:7401", Voter: true, Leader: true, Healthy: true, LastIndex: 41, StableSeconds: 120, Version: "v0.2.0"},
			{Id: "c2", Address: "10.0.0.2:7401", Voter: true, Healthy: true, LastContactMs: 8, LastIndex: 41, StableSeconds: 120, Version: "v0.2.0"},
			{Id: "c4", Address: "10.0.0.4:7401", Voter: true, LastContactMs: 45321, LastIndex: 30, Version: "v0.2.0"},
			{Id: "c5", Address: "10.0.0.5:7401", LastContactMs: -1},
		},
		status: &llmgwv1.ClusterStatusResponse{
			Leader: "c1", Revision: 41, ServerId: "c2", Healthy: true, FailureTolerance: 1, Voters: 3, MinVersion: "v0.2.0",
			Servers: []*llmgwv1.ControlServer{
				{Id: "c2", GrpcAddr: "10.0.0.2:7400", RaftAddr: "10.0.0.2:7401", GossipAddr: "10.0.0.2:7402", Voter: true, Version: "v0.2.0"},
				{Id: "c1", GrpcAddr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7401", GossipAddr: "10.0.0.1:7402", Leader: true, Voter: true, Version: "v0.2.0"},
			},
		},
		known: map[string]bool{"c1": true, "c2": true, "c3": true},
	}
}

func TestServerAndRaftCommands(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		setup   func(f *fakeAdmin)
		wantErr string
		// calls the fake must have seen, in order; nil means none.
		calls []string
		check func(t *testing.T, f *fakeAdmin, out string)
	}{
		{name: "join sends every address, comma lists split", args: []string{"join", "10.0.0.1:7402,10.0.0.2:7402", "10.0.0.3:7402"},
			calls: []string{"Join"},
			check: func(t *testing.T, f *fakeAdmin, out string) {
				if got := strings.Join(f.join.GossipAddrs, " "); got != "10.0.0.1:7402 10.0.0.2:7402 10.0.0.3:7402" {
					t.Errorf("gossip_addrs = %s", got)
				}
				if !strings.Contains(out, "joined through 2 of 3 address(es)") {
					t.Errorf("output: %s", out)
				}
			}},
		{name: "server join is the same verb", args: []string{"server", "join", "10.0.0.1:7402", "-o", "json"},
			calls: []string{"Join"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				var r map[string]any
				if err := json.Unmarshal([]byte(out), &r); err != nil || r["joined"] != 2.0 {
					t.Errorf("json %v (%v): %s", r, err, out)
				}
			}},
		{name: "join without a port is refused before any call", args: []string{"join", "10.0.0.1"}, wantErr: `join: "10.0.0.1" is not a gossip address (host:port)`},
		{name: "join with a bad port is refused before any call", args: []string{"join", "10.0.0.1:99999"}, wantErr: `the port must be 1..65535`},
		{name: "join needs an address", args: []string{"join", ","}, wantErr: "join: at least one gossip address"},
		{name: "join reaching nobody is an error", args: []string{"join", "10.9.9.9:7402"}, setup: func(f *fakeAdmin) { f.joined = 0 },
			calls: []string{"Join"}, wantErr: "join: none of 10.9.9.9:7402 answered"},
		{name: "join refused by the server shows its message", args: []string{"join", "10.9.9.9:7402"},
			setup:   func(f *fakeAdmin) { f.err = status.Error(codes.Unavailable, "join 10.9.9.9:7402: connection refused") },
			calls:   []string{"Join"},
			wantErr: "join: join 10.9.9.9:7402: connection refused"},
		{name: "leave of the leader names the new one", args: []string{"leave"}, calls: []string{"ClusterStatus", "Leave"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				if out != "left the cluster; leadership transferred to c2\n" {
					t.Errorf("output %q", out)
				}
			}},
		{name: "leave of a follower", args: []string{"server", "leave"}, setup: func(f *fakeAdmin) { f.newLeader = "" }, calls: []string{"ClusterStatus", "Leave"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				if out != "left the cluster\n" {
					t.Errorf("output %q", out)
				}
			}},
		{name: "the last voter may not leave", args: []string{"leave"},
			setup:   func(f *fakeAdmin) { f.err = status.Error(codes.FailedPrecondition, "c1 is the last voter") },
			calls:   []string{"ClusterStatus", "Leave"},
			wantErr: "leave: c1 is the last voter"},
		{name: "members as a table, sorted by id", args: []string{"server", "members"}, calls: []string{"Members"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "c1") || !strings.HasPrefix(lines[3], "c4") {
					t.Fatalf("table:\n%s", out)
				}
				if f := strings.Fields(lines[3]); strings.Join(f, " ") != "c4 10.0.0.4:7402 - - left - -" {
					t.Errorf("left member row %q", lines[3])
				}
			}},
		{name: "members as JSON", args: []string{"server", "members", "-o", "json"}, calls: []string{"Members"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				var r []struct {
					ID              string `json:"id"`
					BootstrapExpect int    `json:"bootstrap_expect"`
				}
				if err := json.Unmarshal([]byte(out), &r); err != nil || len(r) != 3 || r[0].ID != "c1" || r[0].BootstrapExpect != 3 {
					t.Errorf("json %+v (%v): %s", r, err, out)
				}
			}},
		{name: "list-peers as a table with roles", args: []string{"raft", "list-peers"}, calls: []string{"ListPeers"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 6 {
					t.Fatalf("table:\n%s", out)
				}
				for i, want := range []string{"c1 10.0.0.1:7401 leader true 0ms 41 2m0s v0.2.0", "c2 10.0.0.2:7401 voter true 8ms 41 2m0s v0.2.0",
					"c3 10.0.0.3:7401 non-voter true 12ms 40 3s v0.2.0",
					"c4 10.0.0.4:7401 voter false 45s 30 - v0.2.0",   // dead: silent for 45 s
					"c5 10.0.0.5:7401 non-voter false never 0 - -"} { // never heard from this term
					if got := strings.Join(strings.Fields(lines[i+1]), " "); got != want {
						t.Errorf("row %d = %q, want %q", i+1, got, want)
					}
				}
			}},
		{name: "list-peers as JSON", args: []string{"raft", "list-peers", "-o", "json"}, calls: []string{"ListPeers"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				var r []struct {
					ID     string `json:"id"`
					Voter  bool   `json:"voter"`
					Leader bool   `json:"leader"`
				}
				if err := json.Unmarshal([]byte(out), &r); err != nil || len(r) != 5 || !r[0].Leader || r[2].Voter {
					t.Errorf("json %+v (%v): %s", r, err, out)
				}
			}},
		{name: "remove-peer", args: []string{"raft", "remove-peer", "c3"}, calls: []string{"ClusterStatus", "RemovePeer c3"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				if out != "removed peer c3 from the Raft configuration\n" {
					t.Errorf("output %q", out)
				}
			}},
		{name: "remove-peer of an unknown id", args: []string{"raft", "remove-peer", "nope"}, calls: []string{"ClusterStatus", "RemovePeer nope"},
			wantErr: "raft remove-peer nope: remove peer: nope is not in the Raft configuration"},
		{name: "remove-peer needs an id", args: []string{"raft", "remove-peer", " "}, wantErr: "raft remove-peer: ID: a server id is required"},
		{name: "transfer-leadership to a named voter", args: []string{"raft", "transfer-leadership", "--to", "c3"}, calls: []string{"TransferLeadership"},
			check: func(t *testing.T, f *fakeAdmin, out string) {
				if f.to != "c3" || out != "leadership transferred to c3\n" {
					t.Errorf("to %q output %q", f.to, out)
				}
			}},
		{name: "transfer-leadership lets raft choose", args: []string{"raft", "transfer-leadership", "-o", "json"}, calls: []string{"TransferLeadership"},
			check: func(t *testing.T, f *fakeAdmin, out string) {
				var r map[string]any
				if err := json.Unmarshal([]byte(out), &r); err != nil || f.to != "" || r["leader"] != "c2" {
					t.Errorf("to %q json %v (%v)", f.to, r, err)
				}
			}},
		{name: "cluster status shows the autopilot figures", args: []string{"cluster", "status"}, calls: []string{"ClusterStatus"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				for _, want := range []string{"leader:            c1\n", "voters:            3\n", "healthy:           true\n",
					"failure tolerance: 1\n", "min version:       v0.2.0\n", "revision:          41\n", "answered by:       c2\n", "GOSSIP"} {
					if !strings.Contains(out, want) {
						t.Errorf("no %q in\n%s", want, out)
					}
				}
				if i, j := strings.Index(out, "\nc1 "), strings.Index(out, "\nc2 "); i < 0 || j < i {
					t.Errorf("servers not listed by id:\n%s", out)
				}
			}},
		{name: "cluster status JSON has a top-level leader", args: []string{"cluster", "status", "-o", "json"}, calls: []string{"ClusterStatus"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				var r map[string]any
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatal(err, out)
				}
				if r["leader"] != "c1" || r["healthy"] != true || r["failure_tolerance"] != 1.0 || r["voters"] != 3.0 || r["min_version"] != "v0.2.0" {
					t.Errorf("json %v", r)
				}
			}},
		{name: "cluster status JSON with no leader says so with an empty string", args: []string{"cluster", "status", "-o", "json"},
			setup: func(f *fakeAdmin) { f.status = &llmgwv1.ClusterStatusResponse{ServerId: "c2"} }, calls: []string{"ClusterStatus"},
			check: func(t *testing.T, _ *fakeAdmin, out string) {
				var r map[string]any
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatal(err, out)
				}
				if v, ok := r["leader"]; !ok || v != "" {
					t.Errorf("leader = %v (present %v)", v, ok)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			if tt.setup != nil {
				tt.setup(f)
			}
			addr := serveFake(t, f)
			out, err := run(addr, tt.args...)
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want %q (output %q)", err, tt.wantErr, out)
			case tt.wantErr == "" && err != nil:
				t.Fatalf("err = %v (output %q)", err, out)
			}
			f.mu.Lock()
			calls := append([]string(nil), f.calls...)
			f.mu.Unlock()
			if strings.Join(calls, ",") != strings.Join(tt.calls, ",") {
				t.Errorf("calls = %v, want %v", calls, tt.calls)
			}
			if tt.check != nil {
				tt.check(t, f, out)
			}
		})
	}
}

// FuzzGossipAddrs: whatever an operator types, the parser returns either an
// error or addresses that each carry a host and a port in range.
func FuzzGossipAddrs(f *testing.F) {
	for _, s := range []string{"10.0.0.1:7402", "a:1,b:2", "[::1]:7402", ":7402", "host:", "x:0", ",,", "h:65536", " h:1 , k:2 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addrs, err := gossipAddrs([]string{s})
		if err != nil {
			if len(addrs) != 0 {
				t.Fatalf("addresses %v with error %v", addrs, err)
			}
			return
		}
		if len(addrs) == 0 {
			t.Fatal("no addresses and no error")
		}
		for _, a := range addrs {
			host, port, ok := strings.Cut(a[strings.LastIndexByte(a, ':'):], ":")
			if !ok || host != "" || port == "" || strings.LastIndexByte(a, ':') == 0 {
				t.Fatalf("%q from %q", a, s)
			}
		}
	})
}
