package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// listAdmin answers every list call with one item.
type listAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
}

func (listAdmin) ListModels(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListModelsResponse, error) {
	return &llmgwv1.ListModelsResponse{Models: []*llmgwv1.Model{{Name: "demo", Engine: "sim", Model: "m", Replicas: 2, Task: "chat"}}}, nil
}

func (listAdmin) ListNodes(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListNodesResponse, error) {
	return &llmgwv1.ListNodesResponse{Revision: 9, Nodes: []*llmgwv1.Node{{Id: "n1", Address: "127.0.0.1", Gpus: 8, State: llmgwv1.NodeState_NODE_STATE_DRAINING}},
		Connected: map[string]bool{"n1": true}}, nil
}

func (listAdmin) ListReplicas(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListReplicasResponse, error) {
	return &llmgwv1.ListReplicasResponse{Replicas: []*llmgwv1.ReplicaView{
		{Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 7, Model: "demo", Node: "n1", Draining: true},
			Status: &llmgwv1.ReplicaStatus{ReplicaId: "demo-0", Uid: 7, Incarnation: 3, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: "127.0.0.1:20000", Restarts: 1},
			Kv:     &llmgwv1.ReplicaKV{Blocks: 12}},
		// A status of an older uid is not this replica's.
		{Replica: &llmgwv1.Replica{Id: "demo-1", Uid: 8, Model: "demo", Node: "n1"},
			Status: &llmgwv1.ReplicaStatus{ReplicaId: "demo-1", Uid: 5, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: "127.0.0.1:20001"}},
	}}, nil
}

func (listAdmin) ListApiKeys(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListApiKeysResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	return &llmgwv1.ListApiKeysResponse{Keys: []*llmgwv1.ApiKey{{Name: "me", Models: []string{"demo"}, CreatedUnix: 1}}, KeysRequired: true}, nil
}

func (listAdmin) ListTenants(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListTenantsResponse, error) {
	return &llmgwv1.ListTenantsResponse{Tenants: []*llmgwv1.Tenant{{Name: "team-a", Models: []string{"demo"}}}}, nil
}

func (listAdmin) ListAliases(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListAliasesResponse, error) {
	return &llmgwv1.ListAliasesResponse{Aliases: []*llmgwv1.Alias{{Name: "chat", Targets: []*llmgwv1.AliasTarget{{Target: "demo", Weight: 1}}}}}, nil
}

func (listAdmin) Usage(context.Context, *llmgwv1.UsageRequest) (*llmgwv1.UsageResponse, error) {
	return &llmgwv1.UsageResponse{Rows: []*llmgwv1.UsageRow{{Tenant: "team-a", Model: "demo", HourUnix: 3600, Counts: &llmgwv1.UsageCounts{Requests: 4}}}}, nil
}

func (listAdmin) ListPeers(context.Context, *llmgwv1.ListPeersRequest) (*llmgwv1.ListPeersResponse, error) {
	return &llmgwv1.ListPeersResponse{Peers: []*llmgwv1.RaftPeer{{Id: "c1", Address: "127.0.0.1:7401", Voter: true, Leader: true, Healthy: true, StableSeconds: 60}}}, nil
}

func (listAdmin) Members(context.Context, *llmgwv1.MembersRequest) (*llmgwv1.MembersResponse, error) {
	return &llmgwv1.MembersResponse{Members: []*llmgwv1.Member{{Id: "c1", GossipAddr: "127.0.0.1:7402", Status: "alive"}}}, nil
}

func (listAdmin) Keyring(context.Context, *llmgwv1.KeyringRequest) (*llmgwv1.KeyringResponse, error) {
	return &llmgwv1.KeyringResponse{Servers: []*llmgwv1.ServerKeyring{{ServerId: "c1", Keys: []*llmgwv1.KeyringKey{{Fingerprint: "aaaa", Primary: true}}}}}, nil
}

// TestListJSONThroughJQ: every list command's -o json is the one shape
// docs/operations.md documents — a JSON array with an object per item,
// enum values in the tables' words — checked with jq as a script would
// (issue 34). A list command added without a case here fails the test.
func TestListJSONThroughJQ(t *testing.T) {
	jq, err := exec.LookPath("jq")
	if err != nil {
		t.Skip("jq is not installed (bash .ci/run installs it)")
	}
	// Every shape: an array of objects, and no enum's Go-side name
	// (REPLICA_PHASE_READY) anywhere in it.
	const shape = `type == "array" and length > 0 and all(.[]; type == "object") and ([.. | strings | select(test("^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$"))] | length == 0)`
	tests := []struct {
		args []string
		// check is a jq expression that must be true of the output.
		check string
	}{
		{[]string{"model", "list"}, `.[0].name == "demo" and .[0].replicas == 2 and .[0].task == "chat"`},
		{[]string{"node", "list"}, `.[0].id == "n1" and .[0].state == "draining" and .[0].connected == true and .[0].gpus == 8`},
		{[]string{"replica", "list"}, `.[0].id == "demo-0" and .[0].model == "demo" and .[0].state == "ready" and .[0].address == "127.0.0.1:20000" and .[0].uid == 7 and .[0].incarnation == 3 and .[0].draining == true and .[0].kv.blocks == 12 and .[1].state == "unknown" and .[1].address == "" and (.[0] | has("replica") or has("status") | not)`},
		{[]string{"apikey", "list"}, `.[0].name == "me" and .[0].models == ["demo"]`},
		{[]string{"tenant", "list"}, `.[0].name == "team-a"`},
		{[]string{"alias", "list"}, `.[0].name == "chat" and .[0].targets[0].target == "demo"`},
		{[]string{"usage"}, `.[0].tenant == "team-a" and .[0].counts.requests == 4`},
		{[]string{"raft", "list-peers"}, `.[0].id == "c1" and .[0].leader == true and .[0].stable_seconds == 60`},
		{[]string{"server", "members"}, `.[0].id == "c1" and .[0].status == "alive"`},
		{[]string{"keyring", "list"}, `.[0].server_id == "c1" and .[0].keys[0].primary == true`},
	}
	covered := map[string]bool{}
	addr := serveAdmin(t, listAdmin{})
	for _, tt := range tests {
		name := strings.Join(tt.args, " ")
		covered[name] = true
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := execute(append([]string{"--addr", addr, "-o", "json"}, tt.args...), &stdout, &stderr); code != exitOK {
				t.Fatalf("exit status %d: %s", code, stderr.String())
			}
			cmd := exec.Command(jq, "-e", "("+shape+") and ("+tt.check+")")
			cmd.Stdin = bytes.NewReader(stdout.Bytes())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("jq -e: %v (%s) on:\n%s", err, bytes.TrimSpace(out), stdout.String())
			}
		})
	}
	// Every command that lists: named list or list-*, plus the two that
	// list under another name.
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(c.CommandPath(), "llmgwctl ")
		if n := c.Name(); (n == "list" || strings.HasPrefix(n, "list-") || path == "server members" || path == "usage") && !covered[path] {
			t.Errorf("%s lists, but TestListJSONThroughJQ does not check its -o json", path)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(&bytes.Buffer{}))
}
