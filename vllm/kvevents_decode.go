package vllm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxExtraKeysDepth bounds nesting inside extra_keys: vLLM's are tuples of
// scalars or of (identifier, offset) pairs, so a few levels suffice, and a
// bound keeps a hostile payload from recursing without limit.
const maxExtraKeysDepth = 8

// errMalformed is wrapped by every decoding error, so a consumer can tell
// a bad payload (count it, ask for a replay) from its own failures.
var errMalformed = errors.New("malformed kv event batch")

// ErrMalformedBatch is matched with errors.Is on DecodeEventBatch errors.
var ErrMalformedBatch = errMalformed

// DecodeEventBatch decodes a KV-event payload (frame 3 of a published
// message) in any shape vLLM has sent (see the history in kvevents.go): a batch of 2 or 3
// elements; events as tagged maps or as positional arrays of any past
// length; block hashes as ints or bytes. Unknown map keys and trailing
// array fields are ignored; events with unknown tags are skipped and
// listed in Skipped.
//
// It never allocates from a length header more than the rest of the
// payload could hold, so a hostile header costs an error, not memory.
// Any error wraps ErrMalformedBatch, and nothing of a bad batch is
// returned: a consumer treats it as lost (a gap to repair), never as half
// applied.
func DecodeEventBatch(payload []byte) (EventBatch, error) {
	return DecodeEventBatchLimited(payload, DecodeLimits{})
}

// DecodeLimits bound what decoding one batch may allocate, over and above
// DecodeEventBatch's rule that no length header may claim more elements
// than bytes remain: a msgpack int takes one byte and decodes into eight,
// a block hash into ExternalBlockHash's 32, so a 16 MiB payload could
// otherwise expand into half a gigabyte (issue 27). Each is checked
// against what the headers declare, before the allocation they ask for.
type DecodeLimits struct {
	// MaxDecodedBytes caps the decoded batch's size, as the sum of every
	// slice, string and event the headers declare; 0: no cap.
	MaxDecodedBytes int
	// MaxBlockHashes caps the block hashes of all the batch's events
	// together (stored and removed); 0: no cap.
	MaxBlockHashes int
}

// DecodeEventBatchLimited is DecodeEventBatch within lim: a batch whose
// headers declare more is malformed (ErrMalformedBatch, and
// ErrBatchTooLarge), and nothing of its excess is allocated.
func DecodeEventBatchLimited(payload []byte, lim DecodeLimits) (EventBatch, error) {
	if len(payload) == 0 {
		return EventBatch{}, fmt.Errorf("%w: empty payload", errMalformed)
	}
	r := newKVReader(payload)
	r.bytesLeft, r.hashesLeft = lim.MaxDecodedBytes, lim.MaxBlockHashes
	if r.bytesLeft <= 0 {
		r.bytesLeft = math.MaxInt
	}
	if r.hashesLeft <= 0 {
		r.hashesLeft = math.MaxInt
	}
	b, err := r.batch()
	if err == nil && r.br.Len() > 0 {
		err = fmt.Errorf("%d bytes after the batch", r.br.Len())
	}
	if err != nil {
		return EventBatch{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	return b, nil
}

// kvReader is msgpack's low-level decoder over the payload, with the
// remaining length at hand to check every length header against.
// msgpack.Decoder reads a bytes.Reader directly (it is an io.ByteScanner),
// so br.Len() is exactly what is left.
type kvReader struct {
	br *bytes.Reader
	d  *msgpack.Decoder
	// bytesLeft and hashesLeft are what DecodeLimits still allow.
	bytesLeft, hashesLeft int
}

// ErrBatchTooLarge is matched with errors.Is on a DecodeEventBatchLimited
// error for a batch over its limits.
var ErrBatchTooLarge = errors.New("kv event batch over the decoding limits")

// Decoded sizes charged against DecodeLimits.MaxDecodedBytes.
const (
	sizeHash      = int(unsafe.Sizeof(ExternalBlockHash{}))
	sizeInt       = int(unsafe.Sizeof(int(0)))
	sizeAny       = int(unsafe.Sizeof(any(nil)))
	sizeExtraKeys = int(unsafe.Sizeof(ExtraKeys(nil)))
	sizeEvent     = int(unsafe.Sizeof(BlockStored{})) // the largest event
	sizeMapEntry  = 48                                // a seen-field entry, key and bucket share
)

// charge takes n elements of size bytes from the budget, before they are
// allocated.
func (r *kvReader) charge(n, size int) error {
	if n > r.bytesLeft/max(size, 1) {
		return fmt.Errorf("%w: %d elements of %d bytes with %d bytes left", ErrBatchTooLarge, n, size, r.bytesLeft)
	}
	r.bytesLeft -= n * size
	return nil
}

func newKVReader(p []byte) *kvReader {
	br := bytes.NewReader(p)
	return &kvReader{br: br, d: msgpack.NewDecoder(br)}
}

func (r *kvReader) peek() (byte, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("truncated: %w", err)
	}
	return c, nil
}

func (r *kvReader) isNil() (bool, error) {
	c, err := r.peek()
	return c == msgpcode.Nil, err
}

// arrayLen reads an array header; each element takes at least a byte.
// ok is false for nil.
func (r *kvReader) arrayLen() (n int, ok bool, err error) {
	n, err = r.d.DecodeArrayLen()
	if err != nil {
		return 0, false, err
	}
	if n < 0 {
		return 0, false, nil
	}
	if n > r.br.Len() {
		return 0, false, fmt.Errorf("array of %d elements in %d remaining bytes", n, r.br.Len())
	}
	return n, true, nil
}

func (r *kvReader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return 0, fmt.Errorf("want a map, got code 0x%02x", c)
	}
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > r.br.Len()/2 {
		return 0, fmt.Errorf("map of %d entries in %d remaining bytes", n, r.br.Len())
	}
	return n, nil
}

func isStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBin(c byte) bool { return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 }

func isNegInt(c byte) bool {
	return c >= msgpcode.NegFixedNumLow || c == msgpcode.Int8 || c == msgpcode.Int16 ||
		c == msgpcode.Int32 || c == msgpcode.Int64
}

func isInt(c byte) bool {
	return c <= msgpcode.PosFixedNumHigh || isNegInt(c) || c == msgpcode.Uint8 || c == msgpcode.Uint16 ||
		c == msgpcode.Uint32 || c == msgpcode.Uint64
}

// raw reads a str or bin body after checking its length fits.
func (r *kvReader) raw() ([]byte, error) {
	n, err := r.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > r.br.Len() {
		return nil, fmt.Errorf("string of %d bytes in %d remaining bytes", n, r.br.Len())
	}
	if n <= 0 {
		return []byte{}, nil
	}
	if err := r.charge(n, 2); err != nil { // the bytes and, mostly, a string of them
		return nil, err
	}
	b := make([]byte, n)
	if err := r.d.ReadFull(b); err != nil {
		return nil, err
	}
	return b, nil
}

func (r *kvReader) str() (string, error) {
	c, err := r.peek()
	if err != nil {
		return "", err
	}
	if !isStr(c) {
		return "", fmt.Errorf("want a string, got code 0x%02x", c)
	}
	b, err := r.raw()
	return string(b), err
}

func (r *kvReader) optStr() (*string, error) {
	if n, err := r.isNil(); err != nil || n {
		return nil, r.skipNil(err)
	}
	s, err := r.str()
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// skipNil consumes a nil already peeked (err is the peek's error).
func (r *kvReader) skipNil(err error) error {
	if err != nil {
		return err
	}
	return r.d.DecodeNil()
}

func (r *kvReader) int() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an int, got code 0x%02x", c)
	}
	if c == msgpcode.Uint64 {
		v, err := r.d.DecodeUint64()
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt {
			return 0, fmt.Errorf("int %d out of range", v)
		}
		return int(v), nil
	}
	v, err := r.d.DecodeInt64()
	return int(v), err
}

func (r *kvReader) optInt() (*int, error) {
	if n, err := r.isNil(); err != nil || n {
		return nil, r.skipNil(err)
	}
	v, err := r.int()
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// hash reads an ExternalBlockHash: an unsigned int, a negative int (from
// engines before #23673 whose builtin hash() could be negative; kept as
// its two's complement), or bytes.
func (r *kvReader) hash() (ExternalBlockHash, error) {
	c, err := r.peek()
	if err != nil {
		return ExternalBlockHash{}, err
	}
	switch {
	case isBin(c):
		b, err := r.raw()
		if err != nil {
			return ExternalBlockHash{}, err
		}
		return BytesBlockHash(b), nil
	case isNegInt(c):
		v, err := r.d.DecodeInt64()
		return IntBlockHash(uint64(v)), err
	case isInt(c):
		v, err := r.d.DecodeUint64()
		return IntBlockHash(v), err
	}
	return ExternalBlockHash{}, fmt.Errorf("want a block hash (int or bytes), got code 0x%02x", c)
}

func (r *kvReader) optHash() (*ExternalBlockHash, error) {
	if n, err := r.isNil(); err != nil || n {
		return nil, r.skipNil(err)
	}
	h, err := r.hash()
	if err != nil {
		return nil, err
	}
	return &h, nil
}

// parentHash reads parent_block_hash. A parent of 0 (an int 0, or a
// digest of zero bytes) is read as none: vLLM sends None for a prompt's
// first block, but a vLLM-compatible engine was seen sending 0 in the
// array form (issue 14), and taking it literally would chain the block to
// a parent no engine ever stored, so no prompt would ever match it. A real
// hash of 0 has a chance of 2^-64 per block.
func (r *kvReader) parentHash() (*ExternalBlockHash, error) {
	h, err := r.optHash()
	if err != nil || h == nil || !h.isZero() {
		return h, err
	}
	return nil, nil
}

// isZero reports whether h is 0: the int 0, or bytes that are all zero.
func (h ExternalBlockHash) isZero() bool {
	return h.low == 0 && strings.Trim(h.raw, "\x00") == ""
}

func (r *kvReader) hashes() ([]ExternalBlockHash, error) {
	n, ok, err := r.arrayLen()
	if err != nil || !ok {
		return nil, errOr(err, "block_hashes is nil")
	}
	if n > r.hashesLeft {
		return nil, fmt.Errorf("%w: %d block hashes with %d left", ErrBatchTooLarge, n, r.hashesLeft)
	}
	r.hashesLeft -= n
	if err := r.charge(n, sizeHash); err != nil {
		return nil, err
	}
	out := make([]ExternalBlockHash, n)
	for i := range out {
		if out[i], err = r.hash(); err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return out, nil
}

func (r *kvReader) ints() ([]int, error) {
	n, ok, err := r.arrayLen()
	if err != nil || !ok {
		return nil, errOr(err, "token_ids is nil")
	}
	if err := r.charge(n, sizeInt); err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i := range out {
		if out[i], err = r.int(); err != nil {
			return nil, fmt.Errorf("token_ids[%d]: %w", i, err)
		}
	}
	return out, nil
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

// extraKeys reads list[tuple | None] | None.
func (r *kvReader) extraKeys() ([]ExtraKeys, error) {
	n, ok, err := r.arrayLen()
	if err != nil || !ok {
		return nil, err
	}
	if err := r.charge(n, sizeExtraKeys); err != nil {
		return nil, err
	}
	out := make([]ExtraKeys, n)
	for i := range out {
		v, err := r.value(0)
		if err != nil {
			return nil, fmt.Errorf("extra_keys[%d]: %w", i, err)
		}
		switch x := v.(type) {
		case nil:
		case []any:
			out[i] = ExtraKeys(x)
		default:
			return nil, fmt.Errorf("extra_keys[%d]: want a tuple or None, got %T", i, v)
		}
	}
	return out, nil
}

// value reads one element of extra keys: a scalar or a nested tuple.
func (r *kvReader) value(depth int) (any, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, r.d.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return r.d.DecodeBool()
	case isNegInt(c):
		return r.d.DecodeInt64()
	case isInt(c):
		v, err := r.d.DecodeUint64()
		if err == nil && v <= math.MaxInt64 {
			return int64(v), nil
		}
		return v, err
	case c == msgpcode.Float || c == msgpcode.Double:
		return r.d.DecodeFloat64()
	case isStr(c):
		return r.str()
	case isBin(c):
		return r.raw()
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		if depth >= maxExtraKeysDepth {
			return nil, fmt.Errorf("extra keys nested deeper than %d", maxExtraKeysDepth)
		}
		n, _, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		if err := r.charge(n, sizeAny); err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported extra key, code 0x%02x", c)
}

// skip consumes one value of any shape without recursion, so that
// nesting cannot exhaust the stack: pending counts values still to skip.
func (r *kvReader) skip() error {
	for pending := 1; pending > 0; pending-- {
		c, err := r.peek()
		if err != nil {
			return err
		}
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			n, _, err := r.arrayLen()
			if err != nil {
				return err
			}
			pending += n
		case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
			n, err := r.mapLen()
			if err != nil {
				return err
			}
			pending += 2 * n
		case isStr(c) || isBin(c):
			n, err := r.d.DecodeBytesLen()
			if err != nil {
				return err
			}
			if n > r.br.Len() {
				return fmt.Errorf("string of %d bytes in %d remaining bytes", n, r.br.Len())
			}
			if _, err := r.br.Seek(int64(max(n, 0)), 1); err != nil {
				return err
			}
		default:
			// Scalars and extensions: msgpack's Skip reads their fixed or
			// declared size and never recurses for them.
			if err := r.d.Skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *kvReader) batch() (EventBatch, error) {
	n, ok, err := r.arrayLen()
	if err != nil || !ok {
		return EventBatch{}, errOr(err, "batch is nil")
	}
	if n < 2 {
		return EventBatch{}, fmt.Errorf("batch of %d elements: want [ts, events] or [ts, events, data_parallel_rank]", n)
	}
	var b EventBatch
	c, err := r.peek()
	if err != nil {
		return b, err
	}
	if c != msgpcode.Double && c != msgpcode.Float && !isInt(c) {
		return b, fmt.Errorf("ts: want a number, got code 0x%02x", c)
	}
	if b.TS, err = r.d.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	m, ok, err := r.arrayLen()
	if err != nil || !ok {
		return b, fmt.Errorf("events: %w", errOr(err, "nil"))
	}
	if err := r.charge(m, sizeAny+sizeEvent); err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	if m > 0 {
		b.Events = make([]Event, 0, m)
	}
	for i := range m {
		ev, tag, err := r.event()
		if err != nil {
			return EventBatch{}, fmt.Errorf("events[%d]: %w", i, err)
		}
		if ev == nil {
			b.Skipped = append(b.Skipped, tag)
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if len(b.Events) == 0 {
		b.Events = nil // all skipped: the same batch as an empty one
	}
	if n >= 3 {
		if b.DataParallelRank, err = r.optInt(); err != nil {
			return EventBatch{}, fmt.Errorf("data_parallel_rank: %w", err)
		}
	}
	for range n - 3 { // fields a later vLLM may add
		if err := r.skip(); err != nil {
			return EventBatch{}, err
		}
	}
	return b, nil
}

// event reads one event in either encoding. A nil Event with no error is
// an unknown tag, returned so the caller can report it.
func (r *kvReader) event() (Event, string, error) {
	c, err := r.peek()
	if err != nil {
		return nil, "", err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return r.mapEvent()
	}
	return r.arrayEvent()
}

// Minimum array lengths, tag included: the shapes of #16750.
const (
	minStoredArray  = 6
	minRemovedArray = 2
)

func (r *kvReader) arrayEvent() (Event, string, error) {
	n, ok, err := r.arrayLen()
	if err != nil || !ok {
		return nil, "", errOr(err, "event is nil")
	}
	if n == 0 {
		return nil, "", errors.New("event is an empty array")
	}
	tag, err := r.str()
	if err != nil {
		return nil, "", fmt.Errorf("tag: %w", err)
	}
	left := n - 1
	// fields reads positional fields in order for as long as the array
	// has them: older engines send fewer.
	fields := func(fs ...field) error {
		for _, f := range fs {
			if left == 0 {
				return nil
			}
			left--
			if err := f.read(); err != nil {
				return fmt.Errorf("%s %s: %w", tag, f.name, err)
			}
		}
		return nil
	}
	var ev Event
	switch tag {
	case TagBlockStored:
		if n < minStoredArray {
			return nil, tag, fmt.Errorf("%s of %d elements: want at least %d", tag, n, minStoredArray)
		}
		e := &BlockStored{}
		err = fields(
			field{"block_hashes", func() (err error) { e.BlockHashes, err = r.hashes(); return }},
			field{"parent_block_hash", func() (err error) { e.ParentBlockHash, err = r.parentHash(); return }},
			field{"token_ids", func() (err error) { e.TokenIDs, err = r.ints(); return }},
			field{"block_size", func() (err error) { e.BlockSize, err = r.int(); return }},
			field{"lora_id", func() (err error) { e.LoRAID, err = r.optInt(); return }},
			field{"medium", func() (err error) { e.Medium, err = r.optStr(); return }},
			field{"lora_name", func() (err error) { e.LoRAName, err = r.optStr(); return }},
			field{"extra_keys", func() (err error) { e.ExtraKeys, err = r.extraKeys(); return }},
			field{"group_idx", func() (err error) { e.GroupIdx, err = r.optInt(); return }},
			field{"kv_cache_spec_kind", func() (err error) { e.KVCacheSpecKind, err = r.optStr(); return }},
			field{"kv_cache_spec_sliding_window", func() (err error) { e.KVCacheSpecSlidingWindow, err = r.optInt(); return }},
			field{"locality", func() (err error) { e.Locality, err = r.optStr(); return }},
		)
		ev = e
	case TagBlockRemoved:
		if n < minRemovedArray {
			return nil, tag, fmt.Errorf("%s of %d elements: want at least %d", tag, n, minRemovedArray)
		}
		e := &BlockRemoved{}
		err = fields(
			field{"block_hashes", func() (err error) { e.BlockHashes, err = r.hashes(); return }},
			field{"medium", func() (err error) { e.Medium, err = r.optStr(); return }},
			field{"group_idx", func() (err error) { e.GroupIdx, err = r.optInt(); return }},
			field{"locality", func() (err error) { e.Locality, err = r.optStr(); return }},
		)
		ev = e
	case TagAllBlocksCleared:
		ev = &AllBlocksCleared{}
	}
	if err != nil {
		return nil, tag, err
	}
	for ; left > 0; left-- { // fields newer than this decoder, or an unknown event's
		if err := r.skip(); err != nil {
			return nil, tag, fmt.Errorf("%s: %w", tag, err)
		}
	}
	return ev, tag, nil
}

// field is one positional field of an array-encoded event.
type field struct {
	name string
	read func() error
}

// eventFields is the union of every event's fields, read from a map
// before its tag is known (msgspec writes "type" first, but a map has no
// order to rely on).
type eventFields struct {
	BlockStored
	seen map[string]bool
}

func (r *kvReader) mapEvent() (Event, string, error) {
	n, err := r.mapLen()
	if err != nil {
		return nil, "", err
	}
	if err := r.charge(n, sizeMapEntry); err != nil {
		return nil, "", err
	}
	var (
		f   = eventFields{seen: make(map[string]bool, n)}
		tag string
	)
	for i := range n {
		c, err := r.peek()
		if err != nil {
			return nil, tag, err
		}
		if !isStr(c) {
			// Not a field msgspec could have written; step over it.
			if err := errors.Join(r.skip(), r.skip()); err != nil {
				return nil, tag, err
			}
			continue
		}
		key, err := r.str()
		if err != nil {
			return nil, tag, fmt.Errorf("key %d: %w", i, err)
		}
		if key == "type" {
			if tag, err = r.str(); err != nil {
				return nil, tag, fmt.Errorf("type: %w", err)
			}
			if tag != TagBlockStored && tag != TagBlockRemoved && tag != TagAllBlocksCleared {
				// Unknown event: skip the rest of it unread, so its
				// fields cannot fail the batch.
				for range 2 * (n - i - 1) {
					if err := r.skip(); err != nil {
						return nil, tag, err
					}
				}
				return nil, tag, nil
			}
			continue
		}
		if err := r.mapField(&f, key); err != nil {
			return nil, tag, fmt.Errorf("%s: %w", key, err)
		}
	}
	switch tag {
	case TagBlockStored:
		for _, k := range []string{"block_hashes", "token_ids", "block_size"} {
			if !f.seen[k] {
				return nil, tag, fmt.Errorf("%s: missing %s", tag, k)
			}
		}
		e := f.BlockStored
		return &e, tag, nil
	case TagBlockRemoved:
		if !f.seen["block_hashes"] {
			return nil, tag, fmt.Errorf("%s: missing block_hashes", tag)
		}
		return &BlockRemoved{BlockHashes: f.BlockHashes, Medium: f.Medium, GroupIdx: f.GroupIdx,
			Locality: f.Locality}, tag, nil
	case TagAllBlocksCleared:
		return &AllBlocksCleared{}, tag, nil
	case "":
		return nil, "", errors.New("event map without a type")
	}
	return nil, tag, nil // unreachable: unknown tags returned above
}

func (r *kvReader) mapField(f *eventFields, key string) (err error) {
	e := &f.BlockStored
	f.seen[key] = true
	switch key {
	case "block_hashes":
		e.BlockHashes, err = r.hashes()
	case "parent_block_hash":
		e.ParentBlockHash, err = r.parentHash()
	case "token_ids":
		e.TokenIDs, err = r.ints()
	case "block_size":
		e.BlockSize, err = r.int()
	case "lora_id":
		e.LoRAID, err = r.optInt()
	case "medium":
		e.Medium, err = r.optStr()
	case "lora_name":
		e.LoRAName, err = r.optStr()
	case "extra_keys":
		e.ExtraKeys, err = r.extraKeys()
	case "group_idx":
		e.GroupIdx, err = r.optInt()
	case "kv_cache_spec_kind":
		e.KVCacheSpecKind, err = r.optStr()
	case "kv_cache_spec_sliding_window":
		e.KVCacheSpecSlidingWindow, err = r.optInt()
	case "locality":
		e.Locality, err = r.optStr()
	default:
		err = r.skip()
	}
	return err
}
