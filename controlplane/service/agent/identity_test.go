package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// callerCtx is a call's context from a peer whose verified certificate
// carries id.
func callerCtx(id mtls.Identity) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{id.URI()}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

// TestCheckIdentity: an agent attaches only as the node its certificate
// names (design §11); a server forwards anyone's hello but holds no
// session; plain text is unchecked.
func TestCheckIdentity(t *testing.T) {
	tests := []struct {
		name string
		ctx  context.Context
		node string
		code codes.Code
		msg  string
	}{
		{"plain text", context.Background(), "n1", codes.OK, ""},
		{"its own node", callerCtx(mtls.Identity{Role: mtls.RoleAgent, Name: "n1"}), "n1", codes.OK, ""},
		{"another node", callerCtx(mtls.Identity{Role: mtls.RoleAgent, Name: "n2"}), "n1", codes.PermissionDenied,
			"agent certificate is for node n2; cannot attach as n1"},
		{"a server forwarding", forwardedBy(callerCtx(mtls.Identity{Role: mtls.RoleServer, Name: "c2"})), "n1", codes.OK, ""},
		{"a server's own session", callerCtx(mtls.Identity{Role: mtls.RoleServer, Name: "c2"}), "n1", codes.PermissionDenied,
			"a server forwards an agent's registration (marked forwarded) but never holds its session; a session needs the agent certificate of node n1; caller is server/c2"},
		{"a router", callerCtx(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), "n1", codes.PermissionDenied, "caller is router/r1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkIdentity(tt.ctx, tt.node)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("checkIdentity = %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}
}

// TestCheckEpoch: an epoch far past the server's clock would outrank every
// later session of the node, so it is refused; one near now, or older, is
// taken.
func TestCheckEpoch(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name  string
		epoch uint64
		ok    bool
	}{
		{"now", uint64(now.UnixNano()), true},
		{"a persisted epoch from long ago, plus one", 42, true},
		{"a clock a second fast", uint64(now.Add(time.Second).UnixNano()), true},
		{"a held epoch four minutes ahead, plus one", uint64(now.Add(4*time.Minute).UnixNano()) + 1, true},
		{"an hour ahead", uint64(now.Add(time.Hour).UnixNano()), false},
		{"23 hours ahead (taken under the old bound of a day)", uint64(now.Add(23 * time.Hour).UnixNano()), false},
		{"just inside the bound", uint64(now.Add(maxEpochAhead).UnixNano()), true},
		{"past the bound", uint64(now.Add(maxEpochAhead).UnixNano()) + 1, false},
		{"the attacker's huge epoch", 1<<64 - 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkEpoch(tt.epoch, now)
			if (err == nil) != tt.ok {
				t.Fatalf("checkEpoch(%d) = %v, want ok %v", tt.epoch, err, tt.ok)
			}
			if err != nil && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code %v, want InvalidArgument", status.Code(err))
			}
		})
	}
}

// forwardedBy marks an incoming call forwarded, as a server's forward
// arrives.
func forwardedBy(ctx context.Context) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs("llmgw-forwarded", "c2"))
}

type replicasOf map[string]*llmgwv1.Replica

func (r replicasOf) Node(string) (*llmgwv1.Node, bool) { return nil, false }
func (r replicasOf) Replica(id string) (*llmgwv1.Replica, bool) {
	x, ok := r[id]
	return x, ok
}
func (r replicasOf) NodeDesired(string) *llmgwv1.DesiredReplicas { return nil }
func (r replicasOf) Applied() (uint64, <-chan struct{})          { return 0, nil }

// TestOwnStatuses: an update keeps only the statuses its node may report:
// not those naming another node, nor those of replicas placed elsewhere; a
// replica this server does not know yet is kept.
func TestOwnStatuses(t *testing.T) {
	a := New(Config{}, Deps{State: replicasOf{
		"m-0": {Id: "m-0", Node: "n1"},
		"m-1": {Id: "m-1", Node: "n2"},
	}, Metrics: NewMetrics(prometheus.NewRegistry())}, nil)
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true, Statuses: []*llmgwv1.ReplicaStatus{
		{ReplicaId: "m-0", Node: "n1", Address: "10.0.0.1:8000"},
		{ReplicaId: "m-1", Node: "n1", Address: "6.6.6.6:8000"},  // placed on n2
		{ReplicaId: "m-0", Node: "n2", Address: "6.6.6.6:8000"},  // names another node
		{ReplicaId: "m-9", Node: "n1", Address: "10.0.0.1:8001"}, // not known here yet
	}}
	got := a.ownKV(u, "n1")
	var kept []string
	for _, s := range got.Statuses {
		kept = append(kept, s.ReplicaId+"@"+s.Address)
	}
	if strings.Join(kept, " ") != "m-0@10.0.0.1:8000 m-9@10.0.0.1:8001" {
		t.Fatalf("kept %v", kept)
	}
	if len(u.Statuses) != 4 {
		t.Fatal("the original update was changed")
	}
}
