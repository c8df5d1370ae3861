package admin

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// answer is how a fake server answers LocalKeyring.
type answer func(ctx context.Context, req *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error)

func keys(fps ...string) answer {
	return func(context.Context, *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error) {
		out := &llmgwv1.ServerKeyring{}
		for i, fp := range fps {
			out.Keys = append(out.Keys, &llmgwv1.KeyringKey{Fingerprint: fp, Primary: i == 0})
		}
		return out, nil
	}
}

// fakeConn answers LocalKeyring as the server at its address would.
type fakeConn struct {
	answer answer
	calls  *atomic.Int32
}

func (c fakeConn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	if method != llmgwv1.ServerService_LocalKeyring_FullMethodName {
		return status.Error(codes.Unimplemented, method)
	}
	c.calls.Add(1)
	if c.answer == nil {
		return status.Error(codes.Unavailable, "connection refused")
	}
	r, err := c.answer(ctx, args.(*llmgwv1.KeyringRequest))
	if err != nil {
		return err
	}
	proto.Merge(reply.(proto.Message), r)
	return nil
}

func (fakeConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

// fakeCluster is the membership and peers of the servers' answers: gossip
// members by id, with status, and the Raft configuration.
type fakeCluster struct {
	members []*llmgwv1.Member
	raft    []string
	answers map[string]answer // by gRPC address
	calls   atomic.Int32
}

// fakeMembers and fakePeers are its two faces; the methods the keyring
// does not use are left to the nil interfaces they embed.
type fakeMembers struct {
	Membership
	*fakeCluster
}

type fakePeers struct {
	Peers
	*fakeCluster
}

func (f fakeMembers) Members() []*llmgwv1.Member { return f.members }
func (f fakePeers) Servers() []*llmgwv1.ControlServer {
	var out []*llmgwv1.ControlServer
	for _, id := range f.raft {
		out = append(out, &llmgwv1.ControlServer{Id: id})
	}
	return out
}
func (f fakePeers) Conn(addr string) grpc.ClientConnInterface {
	return fakeConn{answer: f.answers[addr], calls: &f.calls}
}

// fakeLocal is this server's own LocalKeyring.
type fakeLocal struct{ answer answer }

func (l fakeLocal) LocalKeyring(ctx context.Context, req *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error) {
	return l.answer(ctx, req)
}

// TestKeyringFansOut: every live gossip member answers, this server
// directly; each server's outcome is its own line, sorted by id: an error
// there, a peer that does not answer, one that hangs past the deadline, a
// Raft server gossip does not see alive; a dead or left member is not
// called; a bad request fails the call before any server is asked.
func TestKeyringFansOut(t *testing.T) {
	list := &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST}
	hang := func(ctx context.Context, _ *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	refuse := func(context.Context, *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error) {
		return &llmgwv1.ServerKeyring{Error: "removing the primary"}, nil
	}
	member := func(id, st string) *llmgwv1.Member {
		return &llmgwv1.Member{Id: id, GrpcAddr: id + ":1", Status: st}
	}
	tests := []struct {
		name    string
		members []*llmgwv1.Member
		raft    []string
		answers map[string]answer
		local   answer
		req     *llmgwv1.KeyringRequest
		code    codes.Code
		want    []string // "id keys" or "id !start of its error", in order
		calls   int32
	}{
		{
			name:    "all answer",
			members: []*llmgwv1.Member{member("c1", "alive"), member("c2", "alive"), member("c3", "suspect")},
			raft:    []string{"c1", "c2", "c3"},
			answers: map[string]answer{"c2:1": keys("aa", "bb"), "c3:1": keys("aa")},
			local:   keys("aa", "bb"), req: list,
			want: []string{"c1 aa,bb", "c2 aa,bb", "c3 aa"}, calls: 2,
		},
		{
			name:    "errors per server",
			members: []*llmgwv1.Member{member("c1", "alive"), member("c2", "alive"), member("c3", "alive"), member("c4", "alive"), member("c5", "dead"), member("c6", "left")},
			raft:    []string{"c1", "c2", "c3", "c4", "c5"},
			answers: map[string]answer{"c2:1": refuse, "c4:1": hang},
			local:   keys("aa"), req: list,
			want: []string{"c1 aa", "c2 !removing the primary", "c3 !Unavailable: connection refused", "c4 !DeadlineExceeded", "c5 !not alive in gossip"}, calls: 3,
		},
		{
			name:    "without gossip, this server alone",
			members: []*llmgwv1.Member{member("c1", "alive")}, raft: []string{"c1"},
			local: keys("aa"), req: list, want: []string{"c1 aa"},
		},
		{
			name:    "a bad request asks nobody",
			members: []*llmgwv1.Member{member("c1", "alive"), member("c2", "alive")},
			answers: map[string]answer{"c2:1": keys("aa")},
			local:   keys("aa"), req: &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: "AAAA"},
			code: codes.InvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCluster{members: tt.members, raft: tt.raft, answers: tt.answers}
			a := New("c1", Deps{Peers: fakePeers{fakeCluster: f}, Membership: fakeMembers{fakeCluster: f}, Keyring: fakeLocal{tt.local}}, slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			resp, err := a.Keyring(ctx, tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("err %v, want %s", err, tt.code)
			}
			if f.calls.Load() != tt.calls {
				t.Fatalf("%d peers called, want %d", f.calls.Load(), tt.calls)
			}
			if err != nil {
				return
			}
			if took := time.Since(start); took > keyringTimeout+2*time.Second {
				t.Fatalf("took %v: a hanging server held up the answer past its deadline", took)
			}
			var got []string
			for _, s := range resp.Servers {
				if s.Error != "" {
					got = append(got, s.ServerId+" !"+s.Error)
					continue
				}
				var fps []string
				for _, k := range s.Keys {
					fps = append(fps, k.Fingerprint)
				}
				got = append(got, s.ServerId+" "+strings.Join(fps, ","))
			}
			if len(got) != len(tt.want) {
				t.Fatalf("answers %q, want %q", got, tt.want)
			}
			for i := range got {
				id, part, _ := strings.Cut(tt.want[i], " ")
				if !strings.HasPrefix(got[i], id+" ") || !strings.Contains(got[i], part) || strings.HasPrefix(part, "!") != strings.Contains(got[i], "!") {
					t.Fatalf("answer %d is %q, want %q (all: %q)", i, got[i], tt.want[i], got)
				}
			}
		})
	}
}
