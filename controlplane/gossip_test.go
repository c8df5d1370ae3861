package controlplane

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestServerMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		meta    serverMeta
		wantErr string
	}{
		{"full", serverMeta{ID: "c1", Version: "1.2.3", GRPC: "10.0.0.1:7400", Raft: "10.0.0.1:7401", HTTP: "10.0.0.1:7403", Expect: 3}, ""},
		{"bootstrap", serverMeta{ID: "c1", GRPC: "a:1", Raft: "a:2", Bootstrap: true}, ""},
		{"too long", serverMeta{ID: strings.Repeat("x", 600), GRPC: "a:1", Raft: "a:2"}, "over memberlist's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.meta.encode()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("encode: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeMeta(b)
			if err != nil || got != tt.meta {
				t.Fatalf("decode: %+v, %v; want %+v", got, err, tt.meta)
			}
		})
	}
}

func TestDecodeMetaRefuses(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty", "", "no metadata"},
		{"not json", "{", "decode metadata"},
		{"unknown field", `{"id":"a","g":"a:1","r":"a:2","zz":1}`, "decode metadata"},
		{"no raft", `{"id":"a","g":"a:1"}`, "lacks"},
		{"negative expect", `{"id":"a","g":"a:1","r":"a:2","e":-1}`, "negative"},
		{"oversized", strings.Repeat(" ", memberlist.MetaMaxSize+1), "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeMeta([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decodeMeta(%q) = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
}

// FuzzDecodeMeta: another server's metadata is outside input; decoding
// never panics, and what it accepts encodes back within the size limit.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"id":"c1","v":"1","g":"a:1","r":"a:2","h":"a:3","e":3}`))
	f.Add([]byte(`{"id":"c1","g":"a:1","r":"a:2","b":true}`))
	f.Add([]byte(`null`))
	f.Add([]byte{0xff, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		if _, err := m.encode(); err != nil && len(b) <= memberlist.MetaMaxSize/2 {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
	})
}

func TestTombstonesLastWriterWins(t *testing.T) {
	clock := time.Unix(100, 0)
	g := newGossip(serverMeta{ID: "c1"}, slog.New(slog.DiscardHandler), func() time.Time { return clock })
	g.setRemoved("c4", true)
	if !g.removed("c4") {
		t.Fatal("c4 not removed")
	}
	tests := []struct {
		name  string
		in    string
		wantR bool
	}{
		{"older clear ignored", `{"c4":{"r":false,"t":1}}`, true},
		{"newer clear wins", `{"c4":{"r":false,"t":` + "200000000000" + `}}`, false},
		{"garbage ignored", `{"c4":`, false},
		{"empty id ignored", `{"":{"r":true,"t":300000000000}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.mergeTombstones([]byte(tt.in))
			if got := g.removed("c4"); got != tt.wantR {
				t.Fatalf("removed = %v, want %v", got, tt.wantR)
			}
		})
	}
	// A clear at the same clock reading still supersedes the removal.
	g.setRemoved("c5", true)
	g.setRemoved("c5", false)
	if g.removed("c5") {
		t.Fatal("clear at the same instant lost")
	}
}

// FuzzMergeTombstones: tombstones arrive from other servers; merging never
// panics and a record with an empty id is never kept.
func FuzzMergeTombstones(f *testing.F) {
	f.Add([]byte(`{"c4":{"r":true,"t":5}}`))
	f.Add([]byte(`{"":{"r":true,"t":5}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g := newGossip(serverMeta{ID: "c1"}, slog.New(slog.DiscardHandler), time.Now)
		g.mergeTombstones(b)
		if g.removed("") {
			t.Fatal("empty id kept")
		}
	})
}

func TestMemberlistLogWriter(t *testing.T) {
	tests := []struct{ line, want string }{
		{"[WARN] memberlist: Was able to connect to c2\n", `level=WARN msg="Was able to connect to c2"`},
		{"[DEBUG] memberlist: Stream connection", `level=DEBUG msg="Stream connection"`},
		{"[ERR] memberlist: boom", `level=ERROR msg=boom`},
		{"no level", `level=INFO msg="no level"`},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			var buf bytes.Buffer
			w := &memberlistLogWriter{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			if _, err := w.Write([]byte(tt.line)); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(buf.String(), tt.want) {
				t.Fatalf("got %q, want %q", buf.String(), tt.want)
			}
		})
	}
}

// TestClusterBadInput: refusals that leave the cluster unchanged — the
// last voter leaving, joining an address nobody answers, joining nothing.
func TestClusterBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := haConfig(t, "solo", 0)
	cfg.Bootstrap = true
	r := start(t, cfg)
	defer r.stop(t)
	a := llmgwv1.NewAdminServiceClient(r.conn)
	tests := []struct {
		name string
		call func() error
		want codes.Code
		msg  string
	}{
		{"last voter leaves", func() error { _, err := a.Leave(ctx, &llmgwv1.LeaveRequest{}); return err }, codes.FailedPrecondition, "last voter"},
		{"join unreachable", func() error {
			_, err := a.Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{freeAddr(t)}})
			return err
		}, codes.Unavailable, "none answered"},
		{"join nothing", func() error { _, err := a.Join(ctx, &llmgwv1.JoinRequest{}); return err }, codes.InvalidArgument, "gossip_addrs"},
		{"join garbage", func() error { _, err := a.Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{"nope"}}); return err }, codes.InvalidArgument, "host:port"},
		{"remove unknown", func() error { _, err := a.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "ghost"}); return err }, codes.NotFound, "ghost"},
		{"remove self", func() error { _, err := a.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "solo"}); return err }, codes.FailedPrecondition, "leader"},
		{"transfer to unknown", func() error {
			_, err := a.TransferLeadership(ctx, &llmgwv1.TransferLeadershipRequest{To: "ghost"})
			return err
		}, codes.NotFound, "ghost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != tt.want || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tt.want, tt.msg)
			}
		})
	}
	cs, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil || cs.Leader != "solo" || cs.Voters != 1 || !cs.Healthy {
		t.Fatalf("cluster changed: %v %v", cs, err)
	}
	peers, err := a.ListPeers(ctx, &llmgwv1.ListPeersRequest{})
	if err != nil || len(peers.Peers) != 1 || !peers.Peers[0].Leader {
		t.Fatalf("peers: %v %v", peers, err)
	}
}

func TestGossipStateRoundTrip(t *testing.T) {
	tests := []struct {
		name               string
		b                  []byte
		tombstones, digest string
		bad                bool
	}{
		{"both", encodeState([]byte(`{"c1":{"r":true,"t":1}}`), []byte{0xD1, 1}), `{"c1":{"r":true,"t":1}}`, "\xd1\x01", false},
		{"tombstones alone, as older servers send", []byte(`{"c1":{"r":true,"t":1}}`), `{"c1":{"r":true,"t":1}}`, "", false},
		{"empty", nil, "", "", false},
		{"length past the end", []byte{stateKind, 9, '{'}, "", "", true},
		{"no length", []byte{stateKind}, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tomb, dig, err := decodeState(tt.b)
			if (err != nil) != tt.bad {
				t.Fatalf("err %v", err)
			}
			if !tt.bad && (string(tomb) != tt.tombstones || string(dig) != tt.digest) {
				t.Fatalf("got %q %q", tomb, dig)
			}
		})
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add(encodeState([]byte(`{}`), []byte{0xD1}))
	f.Add([]byte(`{"c1":{"r":true,"t":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tomb, dig, err := decodeState(b)
		if err == nil && len(tomb)+len(dig) > len(b) {
			t.Fatalf("decoded more than was given")
		}
	})
}
