package adapter

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
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeLeader keeps the reports it is given; full refuses new ones.
type fakeLeader struct {
	reports []*llmgwv1.AdapterUseReport
	full    bool
}

func (f *fakeLeader) EnsureAdapter(context.Context, *llmgwv1.EnsureAdapterRequest, time.Duration) (*llmgwv1.EnsureAdapterResponse, string, error) {
	return &llmgwv1.EnsureAdapterResponse{}, "loaded", nil
}

func (f *fakeLeader) ReportAdapterUse(r *llmgwv1.AdapterUseReport) (*llmgwv1.AdapterUseReportResponse, bool) {
	if f.full {
		return nil, false
	}
	f.reports = append(f.reports, r)
	return &llmgwv1.AdapterUseReportResponse{KeepMs: 3000, MinIdleMs: 2000}, true
}

// ctxAs is an incoming call's context from a peer whose verified
// certificate carries id.
func ctxAs(id mtls.Identity) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{id.URI()}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

// TestReportAdapterUse: what the service lets through to the leader —
// bounded reports, a router only under its own name when its certificate
// is known — and the codes of what it refuses.
func TestReportAdapterUse(t *testing.T) {
	use := func(adapter, replica string, active uint32) *llmgwv1.AdapterStatus {
		return &llmgwv1.AdapterStatus{Adapter: adapter, ReplicaId: replica, Uid: 1, Active: active}
	}
	good := func() *llmgwv1.AdapterUseReport {
		return &llmgwv1.AdapterUseReport{Router: "r1", Session: 9, Seq: 1, Uses: []*llmgwv1.AdapterStatus{use("a", "m-0", 2)}}
	}
	with := func(f func(*llmgwv1.AdapterUseReport)) *llmgwv1.AdapterUseReport {
		r := good()
		f(r)
		return r
	}
	long := strings.Repeat("x", maxNameLen+1)
	tests := []struct {
		name     string
		ctx      context.Context
		req      *llmgwv1.AdapterUseReport
		full     bool
		wantCode codes.Code
		wantText string
	}{
		{name: "plain text: kept", ctx: context.Background(), req: good()},
		{name: "the router under its own name: kept", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), req: good()},
		{name: "a server forwarding a router's: kept", ctx: ctxAs(mtls.Identity{Role: mtls.RoleServer, Name: "s2"}), req: good()},
		{name: "a router under another's name", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r2"}), req: good(),
			wantCode: codes.PermissionDenied, wantText: `router: "r1" is not the caller's name "r2"`},
		{name: "no router", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Router = "" }),
			wantCode: codes.InvalidArgument, wantText: "router: 1 to 253 bytes, got 0"},
		{name: "a router name too long", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Router = long }),
			wantCode: codes.InvalidArgument, wantText: "router: 1 to 253 bytes, got 254"},
		{name: "no session", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Session = 0 }),
			wantCode: codes.InvalidArgument, wantText: "session: required"},
		{name: "too many uses", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) {
			for range maxUses {
				r.Uses = append(r.Uses, use("a", "m-0", 0))
			}
		}), wantCode: codes.InvalidArgument, wantText: "uses: at most 4096, got 4097"},
		{name: "a use without an adapter", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Uses[0].Adapter = "" }),
			wantCode: codes.InvalidArgument, wantText: "uses[0].adapter: 1 to 253 bytes, got 0"},
		{name: "a use's replica too long", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Uses[0].ReplicaId = long }),
			wantCode: codes.InvalidArgument, wantText: "uses[0].replica_id: 1 to 253 bytes, got 254"},
		{name: "a use's count past the bound", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Uses[0].Active = maxActive + 1 }),
			wantCode: codes.InvalidArgument, wantText: "uses[0].active: at most 1048576"},
		{name: "a use carrying an agent's reason", ctx: context.Background(), req: with(func(r *llmgwv1.AdapterUseReport) { r.Uses[0].Reason = "x" }),
			wantCode: codes.InvalidArgument, wantText: "uses[0].reason: not for a router to set"},
		{name: "the leader holds as many sessions as it may", ctx: context.Background(), req: good(), full: true,
			wantCode: codes.ResourceExhausted, wantText: "router r1: the leader holds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLeader{full: tt.full}
			s := New(time.Minute, l, slog.New(slog.DiscardHandler))
			resp, err := s.ReportAdapterUse(tt.ctx, tt.req)
			if tt.wantCode == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetKeepMs() != 3000 || resp.GetMinIdleMs() != 2000 || len(l.reports) != 1 || !proto.Equal(l.reports[0], tt.req) {
					t.Errorf("answer %v, leader given %v", resp, l.reports)
				}
				return
			}
			st, _ := status.FromError(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantText) {
				t.Errorf("got %v, want %v containing %q", err, tt.wantCode, tt.wantText)
			}
			if !tt.full && len(l.reports) != 0 {
				t.Errorf("a refused report reached the leader: %v", l.reports)
			}
		})
	}
}

// FuzzCheckUseReport: any decoded report is accepted or refused with an
// error naming a field; an accepted one is within every bound.
func FuzzCheckUseReport(f *testing.F) {
	seed, _ := proto.Marshal(&llmgwv1.AdapterUseReport{Router: "r", Session: 1, Seq: 1,
		Uses: []*llmgwv1.AdapterStatus{{Adapter: "a", ReplicaId: "m-0", Active: 1}}})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r llmgwv1.AdapterUseReport
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if err := checkUseReport(&r); err != nil {
			if !strings.Contains(err.Error(), ":") {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		if r.Router == "" || len(r.Router) > maxNameLen || r.Session == 0 || len(r.Uses) > maxUses {
			t.Fatalf("accepted out of bounds: %v", &r)
		}
		for _, u := range r.Uses {
			if u.Adapter == "" || len(u.Adapter) > maxNameLen || u.ReplicaId == "" || len(u.ReplicaId) > maxNameLen || u.Active > maxActive {
				t.Fatalf("accepted a use out of bounds: %v", u)
			}
		}
	})
}
