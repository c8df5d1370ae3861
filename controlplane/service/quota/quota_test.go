package quota

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeLeader keeps the renewals it is given and answers err, or one grant.
type fakeLeader struct {
	reqs []*llmgwv1.LeaseRequest
	err  error
}

func (f *fakeLeader) Lease(req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	f.reqs = append(f.reqs, req)
	return &llmgwv1.LeaseResponse{TermMs: 10_000, Grants: []*llmgwv1.ShareGrant{{Seq: 1, Share: 5, Limit: 10}}}, nil
}

// fakeProposer keeps the commands proposed and answers err, or revision 7.
type fakeProposer struct {
	cmds []proto.Message
	err  error
}

func (f *fakeProposer) Propose(_ context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if t != llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE {
		return nil, 0, fmt.Errorf("unexpected command %v", t)
	}
	if f.err != nil {
		return nil, 0, f.err
	}
	f.cmds = append(f.cmds, payload)
	return true, 7, nil
}

// ctxAs is an incoming call's context from a peer whose verified
// certificate carries id.
func ctxAs(id mtls.Identity) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{id.URI()}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

// TestLease: what the service lets through to the leader — bounded
// renewals, a router only under its own name when its certificate is
// known — and the codes of what it refuses.
func TestLease(t *testing.T) {
	claim := func() *llmgwv1.ShareClaim {
		return &llmgwv1.ShareClaim{Scope: &llmgwv1.Scope{Tenant: "acme", Kind: llmgwv1.LimitKind_LIMIT_KIND_RPM}, Held: 3, GrantSeq: 1, Demand: 9}
	}
	good := func() *llmgwv1.LeaseRequest {
		return &llmgwv1.LeaseRequest{Router: "r1", Session: 9, Claims: []*llmgwv1.ShareClaim{claim()}}
	}
	with := func(f func(*llmgwv1.LeaseRequest)) *llmgwv1.LeaseRequest {
		r := good()
		f(r)
		return r
	}
	long := strings.Repeat("x", maxNameLen+1)
	bg := context.Background()
	tests := []struct {
		name      string
		ctx       context.Context
		req       *llmgwv1.LeaseRequest
		leaderErr error
		wantCode  codes.Code
		wantText  string
	}{
		{name: "plain text: answered", ctx: bg, req: good()},
		{name: "the router under its own name: answered", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), req: good()},
		{name: "a server forwarding a router's: answered", ctx: ctxAs(mtls.Identity{Role: mtls.RoleServer, Name: "s2"}), req: good()},
		{name: "no claims: answered", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims = nil })},
		{name: "a router under another's name", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r2"}), req: good(),
			wantCode: codes.PermissionDenied, wantText: `router: "r1" is not the caller's name "r2"`},
		{name: "no router", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Router = "" }),
			wantCode: codes.InvalidArgument, wantText: "router: 1 to 253 bytes, got 0"},
		{name: "a router name too long", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Router = long }),
			wantCode: codes.InvalidArgument, wantText: "router: 1 to 253 bytes, got 254"},
		{name: "no session", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Session = 0 }),
			wantCode: codes.InvalidArgument, wantText: "session: required"},
		{name: "too many claims", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) {
			for range maxClaims {
				r.Claims = append(r.Claims, claim())
			}
		}), wantCode: codes.InvalidArgument, wantText: "claims: at most 4096, got 4097"},
		{name: "a claim without a scope", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Scope = nil }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].scope: required"},
		{name: "a tenant name too long", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Scope.Tenant = long }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].scope.tenant: at most 253 bytes, got 254"},
		{name: "a model name too long", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Scope.Model = long }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].scope.model: at most 253 bytes, got 254"},
		{name: "no kind", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Scope.Kind = 0 }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].scope.kind: a limit kind is required, got 0"},
		{name: "an unknown kind", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Scope.Kind = 42 }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].scope.kind: a limit kind is required, got 42"},
		{name: "a demand past the bound", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Demand = maxDemand + 1 }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].demand: at most 1000000000000"},
		{name: "held past the bound", ctx: bg, req: with(func(r *llmgwv1.LeaseRequest) { r.Claims[0].Held = maxDemand + 1 }),
			wantCode: codes.InvalidArgument, wantText: "claims[0].held: at most 1000000000000"},
		// The allocator's quota.ErrFull is service.ToStatus's
		// RESOURCE_EXHAUSTED (its test).
		{name: "the leader names a field", ctx: bg, req: good(),
			leaderErr: &fsm.ValidationError{Field: "claims[1].scope", Reason: "the same scope as claims[0]"},
			wantCode:  codes.InvalidArgument, wantText: "claims[1].scope: the same scope as claims[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLeader{err: tt.leaderErr}
			s := New(l, &fakeProposer{}, func() string { return fsm.TenantsVersion }, slog.New(slog.DiscardHandler))
			resp, err := s.Lease(tt.ctx, tt.req)
			if tt.wantCode == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.GetGrants()) != 1 || len(l.reqs) != 1 || !proto.Equal(l.reqs[0], tt.req) {
					t.Errorf("answer %v, leader given %v", resp, l.reqs)
				}
				return
			}
			st, _ := status.FromError(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantText) {
				t.Errorf("got %v, want %v containing %q", err, tt.wantCode, tt.wantText)
			}
			if len(l.reqs) != 0 {
				t.Errorf("a refused renewal reached the leader: %v", l.reqs)
			}
		})
	}
}

// TestRecordUsage: a valid batch is proposed as RECORD_USAGE and answered
// with its revision; a malformed one is refused naming the field, one of
// another router's name with PERMISSION_DENIED, and none is committed.
func TestRecordUsage(t *testing.T) {
	good := func() *llmgwv1.RecordUsageCommand {
		return &llmgwv1.RecordUsageCommand{Router: "r1", Session: 9, Seq: 3, Rows: []*llmgwv1.UsageRow{
			{Tenant: "acme", Model: "m", HourUnix: 3600 * 490_000, Counts: &llmgwv1.UsageCounts{Requests: 2, InputTokens: 10, OutputTokens: 5}},
		}}
	}
	with := func(f func(*llmgwv1.RecordUsageCommand)) *llmgwv1.RecordUsageCommand {
		r := good()
		f(r)
		return r
	}
	bg := context.Background()
	tests := []struct {
		name       string
		ctx        context.Context
		req        *llmgwv1.RecordUsageCommand
		proposeErr error
		minVersion string // "" for fsm.TenantsVersion
		wantCode   codes.Code
		wantText   string
	}{
		{name: "committed", ctx: bg, req: good()},
		// Background work never opens the gate (design §13.3): refused
		// before anything is proposed.
		{name: "a cluster not admitting tenants' commands yet", ctx: bg, req: good(), minVersion: "v0.1.0",
			wantCode: codes.FailedPrecondition, wantText: `minimum version "v0.1.0" does not admit tenants' commands`},
		{name: "a cluster with no minimum version yet", ctx: bg, req: good(), minVersion: "none",
			wantCode: codes.FailedPrecondition, wantText: `minimum version "" does not admit`},
		{name: "the router under its own name: committed", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r1"}), req: good()},
		{name: "a router under another's name", ctx: ctxAs(mtls.Identity{Role: mtls.RoleRouter, Name: "r2"}), req: good(),
			wantCode: codes.PermissionDenied, wantText: `router: "r1" is not the caller's name "r2"`},
		{name: "no router", ctx: bg, req: with(func(r *llmgwv1.RecordUsageCommand) { r.Router = "" }),
			wantCode: codes.InvalidArgument, wantText: "router: required"},
		{name: "seq 0", ctx: bg, req: with(func(r *llmgwv1.RecordUsageCommand) { r.Seq = 0 }),
			wantCode: codes.InvalidArgument, wantText: "seq: must be above 0"},
		{name: "a row off an hour", ctx: bg, req: with(func(r *llmgwv1.RecordUsageCommand) { r.Rows[0].HourUnix++ }),
			wantCode: codes.InvalidArgument, wantText: "rows[0].hour_unix: must be a positive multiple of 3600"},
		// The gate's refusal (FAILED_PRECONDITION) is service.ToStatus's;
		// the node's test (controlplane/quota_test.go) sends one.
		{name: "refused by the FSM", ctx: bg, req: good(), proposeErr: fmt.Errorf("apply: %w", &fsm.ValidationError{Field: "rows", Reason: "x"}),
			wantCode: codes.InvalidArgument, wantText: "rows: x"},
		{name: "a failure", ctx: bg, req: good(), proposeErr: errors.New("boom"),
			wantCode: codes.Internal, wantText: "record usage of router r1: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakeProposer{err: tt.proposeErr}
			min := tt.minVersion
			switch min {
			case "":
				min = fsm.TenantsVersion
			case "none":
				min = ""
			}
			s := New(&fakeLeader{}, p, func() string { return min }, slog.New(slog.DiscardHandler))
			resp, err := s.RecordUsage(tt.ctx, tt.req)
			if tt.wantCode == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetRevision() != 7 || len(p.cmds) != 1 || !proto.Equal(p.cmds[0], tt.req) {
					t.Errorf("answer %v, proposed %v", resp, p.cmds)
				}
				return
			}
			st, _ := status.FromError(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantText) {
				t.Errorf("got %v, want %v containing %q", err, tt.wantCode, tt.wantText)
			}
			if len(p.cmds) != 0 {
				t.Errorf("a refused batch was committed: %v", p.cmds)
			}
		})
	}
}

// FuzzCheckLease: any decoded renewal is accepted or refused with an error
// naming a field; an accepted one is within every bound.
func FuzzCheckLease(f *testing.F) {
	seed, _ := proto.Marshal(&llmgwv1.LeaseRequest{Router: "r", Session: 1, Claims: []*llmgwv1.ShareClaim{
		{Scope: &llmgwv1.Scope{Tenant: "t", Model: "m", Kind: llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS}, Held: 1, GrantSeq: 2, Demand: 3}}})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r llmgwv1.LeaseRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if err := checkLease(&r); err != nil {
			if !strings.Contains(err.Error(), ":") {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		if r.Router == "" || len(r.Router) > maxNameLen || r.Session == 0 || len(r.Claims) > maxClaims {
			t.Fatalf("accepted out of bounds: %v", &r)
		}
		for _, c := range r.Claims {
			sc := c.GetScope()
			if sc == nil || len(sc.Tenant) > maxNameLen || len(sc.Model) > maxNameLen || c.Held > maxDemand || c.Demand > maxDemand ||
				sc.Kind <= llmgwv1.LimitKind_LIMIT_KIND_UNSPECIFIED || sc.Kind > llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS {
				t.Fatalf("accepted a claim out of bounds: %v", c)
			}
		}
	})
}
