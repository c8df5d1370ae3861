package prefix

import (
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHashes(t *testing.T) {
	sys := strings.Repeat("s", 128)
	tests := []struct {
		name       string
		a, b       string
		chunk, max int
		lenA, same int // len(Hashes(a)), shared leading hashes with b
	}{
		{"empty", "", "", 4, 0, 0, 0},
		{"partial tail ignored", "abcdefg", "abcdefh", 4, 0, 1, 1},
		{"shared system prompt", sys + "hello there, how are you", sys + "something else entirely!", 64, 0, 2, 2},
		{"divergence in chunk 0", "xbcdefgh", "abcdefgh", 4, 0, 2, 0},
		{"max bounds the work", strings.Repeat("a", 100), strings.Repeat("a", 100), 4, 5, 5, 5},
		{"non-positive chunk is the default", sys, sys, 0, 0, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha := Hashes(nil, tt.a, tt.chunk, tt.max)
			hb := Hashes(nil, tt.b, tt.chunk, tt.max)
			if len(ha) != tt.lenA {
				t.Fatalf("len = %d, want %d", len(ha), tt.lenA)
			}
			same := 0
			for same < min(len(ha), len(hb)) && ha[same] == hb[same] {
				same++
			}
			if same != tt.same {
				t.Fatalf("shared = %d, want %d", same, tt.same)
			}
		})
	}
	// Stable across calls and processes: a golden value guards the
	// cross-router agreement.
	if got := Hashes(nil, "abcd", 4, 0); len(got) != 1 || got[0] != 0x92682c7e124e7502 {
		t.Fatalf("hash of abcd = %x", got)
	}
}

func TestTree(t *testing.T) {
	h := func(s string) []uint64 { return Hashes(nil, s, 4, 0) }
	tests := []struct {
		name      string
		max       int
		observe   [][2]string // prompt, replica
		forget    string
		query     string
		accept    []string // nil: any
		want      string
		wantDepth int
	}{
		{"empty tree", 10, nil, "", "aaaabbbb", nil, "", 0},
		{"exact", 10, [][2]string{{"aaaabbbb", "r1"}}, "", "aaaabbbb", nil, "r1", 2},
		{"longest wins", 10, [][2]string{{"aaaa", "r1"}, {"aaaabbbbcccc", "r2"}}, "", "aaaabbbbdddd", nil, "r2", 2},
		{"a later send takes the shared chunks", 10, [][2]string{{"aaaabbbb", "r1"}, {"aaaacccc", "r2"}}, "", "aaaabbbb", nil, "r1", 2},
		{"latest send wins", 10, [][2]string{{"aaaabbbb", "r1"}, {"aaaabbbb", "r2"}}, "", "aaaabbbb", nil, "r2", 2},
		{"rejected replica falls back to a shorter match", 10, [][2]string{{"aaaabbbb", "r2"}, {"aaaacccc", "r1"}}, "", "aaaabbbb", []string{"r1"}, "r1", 1},
		{"forget", 10, [][2]string{{"aaaabbbb", "r2"}, {"aaaacccc", "r1"}}, "r2", "aaaabbbb", nil, "r1", 1},
		{"bounded: oldest evicted", 2, [][2]string{{"aaaabbbb", "r1"}, {"cccc", "r2"}}, "", "aaaa", nil, "", 0},
		{"bounded: recent kept", 2, [][2]string{{"aaaabbbb", "r1"}, {"cccc", "r2"}}, "", "cccc", nil, "r2", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTree[string](tt.max)
			for _, o := range tt.observe {
				tr.Observe(h(o[0]), o[1])
			}
			if tt.forget != "" {
				tr.Forget(tt.forget)
			}
			var accept func(string) bool
			if tt.accept != nil {
				accept = func(r string) bool { return slices.Contains(tt.accept, r) }
			}
			got, depth := tr.Match(h(tt.query), accept)
			if got != tt.want || depth != tt.wantDepth {
				t.Fatalf("Match = %q depth %d, want %q depth %d", got, depth, tt.want, tt.wantDepth)
			}
			if tr.Len() > tt.max {
				t.Fatalf("Len = %d over the bound %d", tr.Len(), tt.max)
			}
		})
	}
}

func BenchmarkHashes8KiB(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)[:8192]
	buf := make([]uint64, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		buf = Hashes(buf[:0], text, DefaultChunk, 128)
	}
}
