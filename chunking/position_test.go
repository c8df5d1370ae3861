package chunking

import (
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestPositionCompare(t *testing.T) {
	tests := []struct {
		name string
		p, q Position
		want int
	}{
		{"the same", Position{5, 3}, Position{5, 3}, 0},
		{"a later seq of the session", Position{5, 4}, Position{5, 3}, 1},
		{"an earlier seq of the session", Position{5, 2}, Position{5, 3}, -1},
		{"a newer session beats a higher seq", Position{6, 1}, Position{5, 900}, 1},
		{"an older session's late delta loses to a lower seq", Position{4, 900}, Position{5, 1}, -1},
		{"the zero position is before everything", Position{}, Position{0, 1}, -1},
		{"no overflow at the ends", Position{^uint64(0), 0}, Position{0, ^uint64(0)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Compare(tt.q); got != tt.want {
				t.Errorf("%v.Compare(%v) = %d, want %d", tt.p, tt.q, got, tt.want)
			}
			if got := tt.q.Compare(tt.p); got != -tt.want {
				t.Errorf("%v.Compare(%v) = %d, want %d (antisymmetry)", tt.q, tt.p, got, -tt.want)
			}
		})
	}
}

func TestPositionNext(t *testing.T) {
	tests := []struct {
		name    string
		held, u Position
		next    bool
	}{
		{"the next seq", Position{5, 3}, Position{5, 4}, true},
		{"the first delta after a full copy at seq 1", Position{5, 1}, Position{5, 2}, true},
		{"the same seq again", Position{5, 3}, Position{5, 3}, false},
		{"a seq skipped", Position{5, 3}, Position{5, 5}, false},
		{"the next seq of another session", Position{5, 3}, Position{6, 4}, false},
		{"a newer session's first seq", Position{5, 3}, Position{6, 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.u == tt.held.Next(); got != tt.next {
				t.Errorf("%v == %v.Next() is %v, want %v", tt.u, tt.held, got, tt.next)
			}
		})
	}
}

func TestPositionOf(t *testing.T) {
	if got := PositionOf(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 7, Seq: 3, Full: true}); got != (Position{7, 3}) {
		t.Errorf("PositionOf = %v, want {7 3}", got)
	}
	if got := PositionOf(nil); got != (Position{}) {
		t.Errorf("PositionOf(nil) = %v, want the zero position", got)
	}
}

func TestIsChunk(t *testing.T) {
	tests := []struct {
		name          string
		chunk, chunks uint32
		want          bool
	}{
		{"a whole update", 0, 0, false},
		{"a whole update that says it is one chunk", 0, 1, false},
		{"the first of several", 0, 3, true},
		{"the last of several", 2, 3, true},
		{"a chunk number with no count", 1, 0, true},
		{"a chunk number past a count of one", 1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Chunk: tt.chunk, Chunks: tt.chunks}
			if got := IsChunk(u); got != tt.want {
				t.Errorf("IsChunk(chunk %d of %d) = %v, want %v", tt.chunk, tt.chunks, got, tt.want)
			}
		})
	}
}
