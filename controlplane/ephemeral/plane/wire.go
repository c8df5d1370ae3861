package plane

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/gossip"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The plane's messages travel as memberlist user messages and push/pull
// state, beside the gossip layer's own tombstones (JSON, first byte '{').
// A leading kind byte tells them apart: package gossip allocates every kind
// byte, and hands a message opening with one of the plane's to Receive.
// The body is protobuf wire format written by hand (the proto file is the
// components' contract; these messages never leave the control plane), so
// an EphemeralUpdate inside is carried as the agent's own encoding and
// decoded with the generated code.
const (
	kindBatch  = gossip.PlaneBatchKind
	kindDigest = gossip.PlaneDigestKind
)

// session is one live agent session an owner announces: the node, the
// agent's epoch, and the last seq the owner holds of it.
type session struct {
	Node       string
	Epoch, Seq uint64
}

// forwarded is one agent update as its owner accepted it, with the owner's
// receive time (Unix ns) for the lag figure.
type forwarded struct {
	RecvUnixNano int64
	Update       *llmgwv1.EphemeralUpdate
}

// request asks the receiver for its held full copy of a node's data.
type request struct {
	Node, Reason string
}

// message is a batch (updates, requests and the sender's sessions) or a
// digest (sessions only). Counter orders one sender's messages, which may
// arrive out of order over separate connections: a session list older
// than one already applied is ignored.
type message struct {
	Kind     byte
	From     string
	Counter  uint64
	Sessions []session
	Updates  []forwarded
	Requests []request
	// ChunkBytes is the sender's chunk budget: a sender that sets it
	// assembles chunked updates, so its peers may send it chunks of at
	// most that size (design §5.4 "Chunks"). Servers of an earlier release
	// leave it out, and get whole updates.
	ChunkBytes uint64
}

// Field numbers of the hand-written wire format.
const (
	fFrom     = 1
	fCounter  = 2
	fSessions = 3
	fUpdates  = 4
	fRequests = 5
	fChunk    = 6

	fSessNode, fSessEpoch, fSessSeq = 1, 2, 3
	fFwdRecv, fFwdUpdate            = 1, 2
	fReqNode, fReqReason            = 1, 2
)

func encode(m *message) ([]byte, error) {
	b := []byte{m.Kind}
	b = protowire.AppendTag(b, fFrom, protowire.BytesType)
	b = protowire.AppendString(b, m.From)
	b = protowire.AppendTag(b, fCounter, protowire.VarintType)
	b = protowire.AppendVarint(b, m.Counter)
	for _, s := range m.Sessions {
		var e []byte
		e = protowire.AppendTag(e, fSessNode, protowire.BytesType)
		e = protowire.AppendString(e, s.Node)
		e = protowire.AppendTag(e, fSessEpoch, protowire.VarintType)
		e = protowire.AppendVarint(e, s.Epoch)
		e = protowire.AppendTag(e, fSessSeq, protowire.VarintType)
		e = protowire.AppendVarint(e, s.Seq)
		b = protowire.AppendTag(b, fSessions, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	for _, f := range m.Updates {
		u, err := proto.Marshal(f.Update)
		if err != nil {
			return nil, fmt.Errorf("encode update of %s: %w", f.Update.GetNode(), err)
		}
		var e []byte
		e = protowire.AppendTag(e, fFwdRecv, protowire.VarintType)
		e = protowire.AppendVarint(e, uint64(f.RecvUnixNano))
		e = protowire.AppendTag(e, fFwdUpdate, protowire.BytesType)
		e = protowire.AppendBytes(e, u)
		b = protowire.AppendTag(b, fUpdates, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	for _, r := range m.Requests {
		var e []byte
		e = protowire.AppendTag(e, fReqNode, protowire.BytesType)
		e = protowire.AppendString(e, r.Node)
		e = protowire.AppendTag(e, fReqReason, protowire.BytesType)
		e = protowire.AppendString(e, r.Reason)
		b = protowire.AppendTag(b, fRequests, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	if m.ChunkBytes > 0 {
		b = protowire.AppendTag(b, fChunk, protowire.VarintType)
		b = protowire.AppendVarint(b, m.ChunkBytes)
	}
	return b, nil
}

var errEmpty = errors.New("empty message")

// decode reads a message from another control node: outside input, so
// anything malformed is an error, never a panic. Unknown fields are
// skipped, so a newer server may add some.
func decode(b []byte) (*message, error) {
	if len(b) == 0 {
		return nil, errEmpty
	}
	if b[0] != kindBatch && b[0] != kindDigest {
		return nil, fmt.Errorf("kind 0x%02x is not a plane message", b[0])
	}
	m := &message{Kind: b[0]}
	err := fields(b[1:], func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == fFrom && typ == protowire.BytesType:
			m.From = string(v)
		case num == fCounter && typ == protowire.VarintType:
			m.Counter = n
		case num == fChunk && typ == protowire.VarintType:
			m.ChunkBytes = n
		case num == fSessions && typ == protowire.BytesType:
			var s session
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
				switch {
				case num == fSessNode && typ == protowire.BytesType:
					s.Node = string(v)
				case num == fSessEpoch && typ == protowire.VarintType:
					s.Epoch = n
				case num == fSessSeq && typ == protowire.VarintType:
					s.Seq = n
				}
				return nil
			}); err != nil {
				return fmt.Errorf("session: %w", err)
			}
			if s.Node == "" || s.Epoch == 0 {
				return errors.New("session without node or epoch")
			}
			m.Sessions = append(m.Sessions, s)
		case num == fUpdates && typ == protowire.BytesType:
			f := forwarded{}
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
				switch {
				case num == fFwdRecv && typ == protowire.VarintType:
					f.RecvUnixNano = int64(n)
				case num == fFwdUpdate && typ == protowire.BytesType:
					f.Update = &llmgwv1.EphemeralUpdate{}
					if err := proto.Unmarshal(v, f.Update); err != nil {
						return fmt.Errorf("ephemeral update: %w", err)
					}
				}
				return nil
			}); err != nil {
				return fmt.Errorf("update: %w", err)
			}
			if f.Update.GetNode() == "" {
				return errors.New("update without a node")
			}
			m.Updates = append(m.Updates, f)
		case num == fRequests && typ == protowire.BytesType:
			var r request
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == fReqNode && typ == protowire.BytesType:
					r.Node = string(v)
				case num == fReqReason && typ == protowire.BytesType:
					r.Reason = string(v)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("request: %w", err)
			}
			if r.Node == "" {
				return errors.New("request without a node")
			}
			m.Requests = append(m.Requests, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode plane message: %w", err)
	}
	if m.From == "" {
		return nil, errors.New("decode plane message: no sender")
	}
	return m, nil
}

// fields walks one level of protobuf wire format, handing each field's
// number, type and value (bytes for length-delimited, n for varints) to fn.
// Other wire types are skipped.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		var v []byte
		var n uint64
		switch typ {
		case protowire.BytesType:
			v, l = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			n, l = protowire.ConsumeVarint(b)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		if err := fn(num, typ, v, n); err != nil {
			return err
		}
	}
	return nil
}
