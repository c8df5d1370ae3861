package flow

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/flowview"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// leadership is a Raft member that leads or not.
type leadership struct{ leader bool }

func (l *leadership) IsLeader() bool { return l.leader }
func (l *leadership) NotLeader() error {
	return status.Error(codes.Unavailable, "not the leader; the leader is c2 at 127.0.0.1:7400")
}

// ctxAs is an incoming call's context from a peer whose verified
// certificate carries id.
func ctxAs(id mtls.Identity) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{id.URI()}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

func depth(model, class string, queued uint64) *llmgwv1.FlowDepth {
	return &llmgwv1.FlowDepth{Model: model, Class: class, Queued: queued, OldestWaitMs: 10}
}

// TestReport: what the service lets through to the table — a router under
// its own name (or any name without a certificate, or forwarded by a
// server), on the leader — and the codes of what it refuses: another
// router's name, a server that does not lead, a report outside the
// table's bounds, a router beyond the table's.
func TestReport(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	table := flowview.New(flowview.Config{MaxRouters: 3, Now: func() time.Time { return now }}, nil)
	raft := &leadership{leader: true}
	s := New(table, raft, slog.New(slog.DiscardHandler))
	report := func(router string, ds ...*llmgwv1.FlowDepth) *llmgwv1.FlowReport {
		return &llmgwv1.FlowReport{Router: router, Session: 7, Depths: ds}
	}
	bg := context.Background()
	tests := []struct {
		name     string
		ctx      context.Context
		req      *llmgwv1.FlowReport
		leader   bool
		code     codes.Code
		msg      string
		othersOf uint64 // the queued its view shows
	}{
		{"a router under its own name", ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), report("r1", depth("m", "batch", 4)), true, codes.OK, "", 0},
		{"without TLS", bg, report("r2", depth("m", "batch", 2)), true, codes.OK, "", 4},
		{"forwarded by a server", ctxAs(mtls.Identity{Role: mtls.RoleServer, Name: "c2"}), report("r3", depth("m", "interactive", 1)), true, codes.OK, "", 6},
		{"under another router's name", ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), report("r2"), true, codes.PermissionDenied,
			`router: "r2" is not the caller's name "r1"`, 0},
		{"not the leader", bg, report("r1"), false, codes.Unavailable, "not the leader; the leader is c2", 0},
		{"outside the bounds", bg, &llmgwv1.FlowReport{Router: "r1"}, true, codes.InvalidArgument, "session: required", 0},
		{"a long class", bg, report("r1", depth("m", strings.Repeat("c", 257), 1)), true, codes.InvalidArgument, "depths[0].class: at most 256 bytes", 0},
		{"one router too many", bg, report("r4", depth("m", "batch", 1)), true, codes.ResourceExhausted, "r4", 0},
		{"a router held reports again", bg, report("r1", depth("m", "batch", 5)), true, codes.OK, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raft.leader = tt.leader
			v, err := s.Report(tt.ctx, tt.req)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("%v, want %v with %q", err, tt.code, tt.msg)
			}
			if err != nil {
				return
			}
			var queued uint64
			for _, d := range v.Depths {
				queued += d.Queued
			}
			if queued != tt.othersOf || v.ValidMs != 3000 {
				t.Fatalf("view %v: want the others' %d queued, valid 3 s", v, tt.othersOf)
			}
		})
	}
}
