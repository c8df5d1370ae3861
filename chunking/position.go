package chunking

import (
	"cmp"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Position is where an update stands in its node's stream (design §5.4
// "Epochs"): the agent session's epoch, then the update's seq within that
// session. (node, epoch, seq) travels unchanged from the agent through
// every server to the routers, and every hop judges an update by its
// Position against the one it holds for the node: a full copy later than
// what is held replaces it, a delta at exactly Next of what is held is
// applied, anything at or before what is held is stale, and any other delta
// is a gap. Comparable, so it keys a map of buffered updates.
type Position struct {
	Epoch, Seq uint64
}

// PositionOf is u's position.
func PositionOf(u *llmgwv1.EphemeralUpdate) Position {
	return Position{Epoch: u.GetEpoch(), Seq: u.GetSeq()}
}

// Compare orders p against q as cmp.Compare does: -1 when p is earlier, 0
// the same, +1 later. The epoch decides first, the seq only within one
// epoch: each session numbers its updates from 1 again, and its epoch
// (max(last persisted + 1, now)) is above every earlier session's, so a
// newer session's update is later than anything of an older one whatever
// the seqs. That is how a newer session wins on every hop, even against
// late deltas of an old one.
func (p Position) Compare(q Position) int {
	if c := cmp.Compare(p.Epoch, q.Epoch); c != 0 {
		return c
	}
	return cmp.Compare(p.Seq, q.Seq)
}

// Next is the position of the delta that follows p: the same session, the
// next seq. A delta is applied only there, since it changes what is held
// at p; a later one means one was missed, and a full copy must close the
// gap.
func (p Position) Next() Position {
	return Position{Epoch: p.Epoch, Seq: p.Seq + 1}
}
