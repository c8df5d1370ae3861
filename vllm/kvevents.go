package vllm

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// KV-cache events: the batches vLLM's ZmqEventPublisher sends as the third
// frame of every message (design §7.5 tier 2). They are the only exact account
// of what an engine's prefix cache holds, which is what lets the router
// prefer the replica that has already prefilled a prompt's prefix instead
// of guessing from where it sent similar prompts before.
//
// The wire shape has changed many times (vLLM PRs #16750 onwards, in
// vllm/distributed/kv_events.py): events were positional arrays that grew
// from 6 to 12 elements, then became tagged maps; block hashes are ints by
// default and 32-byte digests on request.
// A fleet upgrades engines one at a time, so the decoder accepts every
// shape that has shipped, and the encoder can write the two current ones
// so the simulator can stand in for either.

// Event tags: msgspec tags each event with its class's __qualname__.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// Values of BlockStored.Medium and BlockRemoved.Medium. Only GPU blocks
// (or a missing medium, from engines older than the field) shorten a
// prefill; CPU and storage tiers belong to offloading connectors.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// KVCacheSpecFullAttention is the kv_cache_spec_kind of a full-attention
// group: the only kind whose blocks hold a whole prefix, so the only kind a
// prefix index should count.
const KVCacheSpecFullAttention = "full_attention"

// Encoding is how events inside a batch are written. The batch itself is
// always a msgpack array.
type Encoding uint8

const (
	// EncodingMap writes each event as a map {"type": tag, field: value}
	// with None-defaulted fields left out: vLLM since #42892 (mid-2026).
	// It is the zero value because it is what current vLLM sends.
	EncodingMap Encoding = iota
	// EncodingArray writes each event as [tag, field, ...] with every
	// field present: vLLM before #42892.
	EncodingArray
)

func (e Encoding) String() string {
	switch e {
	case EncodingMap:
		return "map"
	case EncodingArray:
		return "array"
	}
	return "Encoding(" + strconv.Itoa(int(e)) + ")"
}

// ParseEncoding reads "map" or "array", as a flag gives them.
func ParseEncoding(s string) (Encoding, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "map":
		return EncodingMap, nil
	case "array":
		return EncodingArray, nil
	}
	return 0, fmt.Errorf("kv events encoding %q: must be map or array", s)
}

// ExternalBlockHash is a block hash as an event carries it: vLLM's
// ExternalBlockHash, either an int — by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) the low 64 bits of the digest —
// or the digest's raw bytes (=0).
//
// It is comparable and so usable as a map key; two hashes are equal when
// they have the same form and value. A consumer that may see both forms
// (engines of one model configured differently) should key by Uint64,
// which is the same for both forms of one block.
type ExternalBlockHash struct {
	low     uint64
	raw     string // the digest bytes when isBytes
	isBytes bool
}

// IntBlockHash is a hash carried as an int.
func IntBlockHash(v uint64) ExternalBlockHash { return ExternalBlockHash{low: v} }

// BytesBlockHash is a hash carried as bytes: 32 for sha256 algorithms, 16
// for xxhash ones, 64 for some hybrid-model engines (vLLM's
// maybe_convert_block_hash in vllm/v1/core/kv_cache_utils.py).
func BytesBlockHash(b []byte) ExternalBlockHash {
	return ExternalBlockHash{low: low64(b), raw: string(b), isBytes: true}
}

// ExternalHash is vLLM's maybe_convert_block_hash: the form in which an
// engine publishes digest h, as an int when asInt (vLLM's default) or as
// the digest's bytes.
func ExternalHash(h BlockHash, asInt bool) ExternalBlockHash {
	if asInt {
		return IntBlockHash(h.Uint64())
	}
	return BytesBlockHash(h[:])
}

// low64 is int.from_bytes(b, "big") & (2**64-1): the last 8 bytes.
func low64(b []byte) uint64 {
	var v uint64
	if len(b) > 8 {
		b = b[len(b)-8:]
	}
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// IsBytes reports whether the event carried the hash as bytes.
func (h ExternalBlockHash) IsBytes() bool { return h.isBytes }

// Uint64 is the hash as an int event carries it: the int itself, or the
// low 64 bits (last 8 bytes, big-endian) of the bytes. It equals
// BlockHash.Uint64 of the same block.
func (h ExternalBlockHash) Uint64() uint64 { return h.low }

// Bytes is a copy of the hash's bytes, or nil for an int hash.
func (h ExternalBlockHash) Bytes() []byte {
	if !h.isBytes {
		return nil
	}
	return []byte(h.raw)
}

// Digest is the full sha256 digest, when the event carried one (32 bytes).
func (h ExternalBlockHash) Digest() (BlockHash, bool) {
	var d BlockHash
	if !h.isBytes || len(h.raw) != len(d) {
		return d, false
	}
	copy(d[:], h.raw)
	return d, true
}

// Matches reports whether h is how an engine would publish digest d:
// equal low 64 bits for an int, equal bytes for a 32-byte hash.
func (h ExternalBlockHash) Matches(d BlockHash) bool {
	if !h.isBytes {
		return h.low == d.Uint64()
	}
	return h.raw == string(d[:])
}

// String is the int in decimal or the bytes in hex.
func (h ExternalBlockHash) String() string {
	if h.isBytes {
		return hex.EncodeToString([]byte(h.raw))
	}
	return strconv.FormatUint(h.low, 10)
}

// EventBatch is one published message: the events of one engine step.
type EventBatch struct {
	// TS is when the batch was made, Unix seconds (Python's time.time()).
	TS float64
	// Events are the known events, in the engine's order.
	Events []Event
	// DataParallelRank is the publishing rank; nil when the batch had no
	// rank (vLLM before #18925) or a nil one.
	DataParallelRank *int
	// Skipped are the tags of events the decoder did not know, in order.
	// They are not in Events. A newer engine may add event types; a
	// consumer should count them rather than fail, since everything it
	// does know about in the batch is still exact.
	Skipped []string
}

// Event is one of *BlockStored, *BlockRemoved, *AllBlocksCleared.
type Event interface {
	// Tag is the event's msgspec tag ("BlockStored", ...).
	Tag() string
}

// BlockStored says blocks became cached: BlockHashes in prefix order, the
// first chained from ParentBlockHash (nil: from the prompt's start).
// Pointer fields are Python's None when nil.
type BlockStored struct {
	BlockHashes     []ExternalBlockHash
	ParentBlockHash *ExternalBlockHash
	// TokenIDs are the tokens of all the blocks, BlockSize per block.
	TokenIDs  []int
	BlockSize int
	// LoRAID is the adapter's int id; deprecated upstream in favour of
	// LoRAName, which is what the block hash includes.
	LoRAID   *int
	Medium   *string
	LoRAName *string
	// ExtraKeys holds, per block, the extra keys its hash included (a
	// tuple, as []any of string, int64, uint64, float64, bool, []byte, nil
	// and nested []any), or nil for none. A nil ExtraKeys is None: no
	// extra keys for any block.
	ExtraKeys                []ExtraKeys
	GroupIdx                 *int
	KVCacheSpecKind          *string
	KVCacheSpecSlidingWindow *int
	Locality                 *string
}

// ExtraKeys are one block's extra hash keys: a tuple, or nil for None.
type ExtraKeys []any

// BlockRemoved says blocks were evicted. vLLM sends one hash per event.
type BlockRemoved struct {
	BlockHashes []ExternalBlockHash
	Medium      *string
	GroupIdx    *int
	Locality    *string
}

// AllBlocksCleared says the engine's prefix cache was emptied
// (/reset_prefix_cache): everything stored before it is gone.
type AllBlocksCleared struct{}

func (*BlockStored) Tag() string      { return TagBlockStored }
func (*BlockRemoved) Tag() string     { return TagBlockRemoved }
func (*AllBlocksCleared) Tag() string { return TagAllBlocksCleared }

// OnGPU reports whether the blocks are in GPU memory: medium "GPU", or no
// medium from an engine older than the field.
func (e *BlockStored) OnGPU() bool { return onGPU(e.Medium) }

// OnGPU is BlockStored.OnGPU for removals.
func (e *BlockRemoved) OnGPU() bool { return onGPU(e.Medium) }

// FullAttention reports whether the blocks belong to a full-attention
// group (or the engine did not say, as engines before #40984 do not).
func (e *BlockStored) FullAttention() bool {
	return e.KVCacheSpecKind == nil || *e.KVCacheSpecKind == KVCacheSpecFullAttention
}

func onGPU(m *string) bool { return m == nil || *m == MediumGPU }

// Ptr returns a pointer to v: for the optional fields of events.
func Ptr[T any](v T) *T { return &v }

// The ZMQ framing (vLLM's ZmqEventPublisher in
// vllm/distributed/kv_events.py). A published message is three
// frames [topic, seq, payload]; seq is 8 bytes big-endian, from 0 per
// publisher process. The replay socket answers [b"", start_seq] with
// [b"", topic, seq, payload] per buffered batch and an end marker.

// ReplayEndSeq is the seq of the replay end marker (Python's
// (-1).to_bytes(8, "big", signed=True)), whose payload is empty.
const ReplayEndSeq = ^uint64(0)

// SeqFrame is seq as its frame: 8 bytes, big-endian.
func SeqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// ParseSeq reads a seq frame; anything but 8 bytes is an error.
func ParseSeq(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("kv events: seq frame of %d bytes: want 8", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// PubFrames are the frames of one published batch.
func PubFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), SeqFrame(seq), payload}
}

// ParsePubFrames splits a message a SUB socket received.
func ParsePubFrames(frames [][]byte) (topic string, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return "", 0, nil, fmt.Errorf("kv events: message of %d frames: want 3 (topic, seq, payload)", len(frames))
	}
	seq, err = ParseSeq(frames[1])
	if err != nil {
		return "", 0, nil, err
	}
	return string(frames[0]), seq, frames[2], nil
}

// ReplayRequestFrames is what a DEALER sends to ask for every buffered
// batch from start on: [b"", start].
func ReplayRequestFrames(start uint64) [][]byte { return [][]byte{{}, SeqFrame(start)} }

// ParseReplayRequest reads a request as a ROUTER socket receives it:
// [identity, b"", start]. vLLM drops any other shape.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("kv events: replay request of %d frames: want [identity, empty, start_seq]", len(frames))
	}
	start, err = ParseSeq(frames[2])
	if err != nil {
		return nil, 0, fmt.Errorf("kv events: replay request: %w", err)
	}
	return frames[0], start, nil
}

// ReplayReplyFrames is one reply as a ROUTER sends it to identity: a
// buffered batch, or with ReplayEndSeq and an empty topic and payload the
// end marker.
func ReplayReplyFrames(identity []byte, topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{identity, {}, []byte(topic), SeqFrame(seq), payload}
}

// ReplayReply is one reply as a DEALER receives it.
type ReplayReply struct {
	Topic   string
	Seq     uint64
	Payload []byte
	// End marks the end of the replay: no batch, nothing more to come for
	// this request.
	End bool
}

// ParseReplayReply reads a reply as a DEALER receives it: [b"", topic,
// seq, payload] since vLLM #45177, or [b"", seq, payload] before it. An
// empty payload ends the replay, as vLLM's own subscriber takes it.
func ParseReplayReply(frames [][]byte) (ReplayReply, error) {
	if len(frames) < 3 || len(frames) > 4 || len(frames[0]) != 0 {
		return ReplayReply{}, fmt.Errorf("kv events: replay reply of %d frames: want [empty, topic, seq, payload] or [empty, seq, payload]", len(frames))
	}
	var r ReplayReply
	rest := frames[1:]
	if len(rest) == 3 {
		r.Topic = string(rest[0])
		rest = rest[1:]
	}
	seq, err := ParseSeq(rest[0])
	if err != nil {
		return ReplayReply{}, fmt.Errorf("kv events: replay reply: %w", err)
	}
	r.Seq, r.Payload = seq, rest[1]
	r.End = len(r.Payload) == 0
	return r, nil
}
