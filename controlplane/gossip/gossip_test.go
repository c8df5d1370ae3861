package gossip

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestServerMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		meta    Meta
		wantErr string
	}{
		{"full", Meta{ID: "c1", Version: "1.2.3", GRPC: "10.0.0.1:7400", Raft: "10.0.0.1:7401", HTTP: "10.0.0.1:7403", Expect: 3}, ""},
		{"bootstrap", Meta{ID: "c1", GRPC: "a:1", Raft: "a:2", Bootstrap: true}, ""},
		{"too long", Meta{ID: strings.Repeat("x", 600), GRPC: "a:1", Raft: "a:2"}, "over memberlist's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.meta.Encode()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("encode: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMeta(b)
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
			if _, err := DecodeMeta([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DecodeMeta(%q) = %v, want %q", tt.in, err, tt.want)
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
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		if _, err := m.Encode(); err != nil && len(b) <= memberlist.MetaMaxSize/2 {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
	})
}

func TestTombstonesLastWriterWins(t *testing.T) {
	clock := time.Unix(100, 0)
	g := New(Meta{ID: "c1"}, nil, slog.New(slog.DiscardHandler), func() time.Time { return clock })
	g.SetRemoved("c4", true)
	if !g.Removed("c4") {
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
			if got := g.Removed("c4"); got != tt.wantR {
				t.Fatalf("removed = %v, want %v", got, tt.wantR)
			}
		})
	}
	// A clear at the same clock reading still supersedes the removal.
	g.SetRemoved("c5", true)
	g.SetRemoved("c5", false)
	if g.Removed("c5") {
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
		g := New(Meta{ID: "c1"}, nil, slog.New(slog.DiscardHandler), time.Now)
		g.mergeTombstones(b)
		if g.Removed("") {
			t.Fatal("empty id kept")
		}
	})
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

// TestTombstonesCopyAndTime: SetRemoved returns the time it recorded, just
// after the previous record when the clock has not moved, and Tombstones
// is a copy the caller owns.
func TestTombstonesCopyAndTime(t *testing.T) {
	clock := time.Unix(100, 0)
	g := New(Meta{ID: "c1"}, nil, slog.New(slog.DiscardHandler), func() time.Time { return clock })
	at := g.SetRemoved("c4", true)
	if at != clock.UnixNano() {
		t.Fatalf("SetRemoved at %d, want the clock's %d", at, clock.UnixNano())
	}
	if again := g.SetRemoved("c4", false); again != at+1 {
		t.Fatalf("second SetRemoved at %d, want %d (just after the first)", again, at+1)
	}
	ts := g.Tombstones()
	if got := ts["c4"]; got.Removed || got.At != at+1 || len(ts) != 1 {
		t.Fatalf("Tombstones = %v", ts)
	}
	ts["c9"] = Tombstone{Removed: true, At: 1}
	if _, ok := g.Tombstones()["c9"]; ok {
		t.Fatal("Tombstones shares its map with the caller")
	}
}
