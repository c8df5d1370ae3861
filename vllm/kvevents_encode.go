package vllm

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The longest arrays vLLM sent, tag included: the field set of #40984.
// Events became maps (#42892) before locality was added (#48281), so no
// engine ever sent locality in an array.
const (
	storedArrayLen  = 12
	removedArrayLen = 4
)

// EncodeOption changes how EncodeEventBatch writes a batch, to imitate
// older engines.
type EncodeOption func(*encodeOptions)

type encodeOptions struct {
	storedLen, removedLen int
	noRank                bool
}

// WithArrayLengths writes array-encoded events with only their first
// fields, as older vLLM did: blockStored elements for BlockStored (6, 7, 8,
// 9, 10 or 12, tag included; 12 by default) and blockRemoved for
// BlockRemoved (2, 3 or 4; 4 by default). Map encoding ignores it.
func WithArrayLengths(blockStored, blockRemoved int) EncodeOption {
	return func(o *encodeOptions) { o.storedLen, o.removedLen = blockStored, blockRemoved }
}

// WithoutRank writes the 2-element batch [ts, events] of vLLM before
// #18925.
func WithoutRank() EncodeOption { return func(o *encodeOptions) { o.noRank = true } }

// EncodeEventBatch writes b as msgspec does in vLLM (msgspec's
// _core.c encoder): the
// batch as an array, events as enc says, ints at minimal width, ts as a
// float64. Each block hash is written in the form it holds, so the caller
// chooses ints or bytes with ExternalHash. Skipped is not written.
func EncodeEventBatch(b EventBatch, enc Encoding, opts ...EncodeOption) ([]byte, error) {
	o := encodeOptions{storedLen: storedArrayLen, removedLen: removedArrayLen}
	for _, opt := range opts {
		opt(&o)
	}
	if o.storedLen < minStoredArray || o.storedLen > storedArrayLen {
		return nil, fmt.Errorf("encode kv events: BlockStored array length %d: must be in %d..%d", o.storedLen, minStoredArray, storedArrayLen)
	}
	if o.removedLen < minRemovedArray || o.removedLen > removedArrayLen {
		return nil, fmt.Errorf("encode kv events: BlockRemoved array length %d: must be in %d..%d", o.removedLen, minRemovedArray, removedArrayLen)
	}
	if enc != EncodingMap && enc != EncodingArray {
		return nil, fmt.Errorf("encode kv events: unknown encoding %v", enc)
	}
	var buf bytes.Buffer
	w := kvWriter{e: msgpack.NewEncoder(&buf)}
	if o.noRank {
		w.arrayLen(2)
	} else {
		w.arrayLen(3)
	}
	w.err = w.e.EncodeFloat64(b.TS)
	w.arrayLen(len(b.Events))
	for i, ev := range b.Events {
		var err error
		switch e := ev.(type) {
		case *BlockStored:
			err = w.stored(e, enc, o.storedLen)
		case *BlockRemoved:
			err = w.removed(e, enc, o.removedLen)
		case *AllBlocksCleared:
			if enc == EncodingArray {
				w.arrayLen(1)
			} else {
				w.mapLen(1)
				w.str("type")
			}
			w.str(TagAllBlocksCleared)
		default:
			err = fmt.Errorf("unknown event type %T", ev)
		}
		if err != nil {
			return nil, fmt.Errorf("encode kv events: events[%d]: %w", i, err)
		}
	}
	if !o.noRank {
		w.optInt(b.DataParallelRank)
	}
	if w.err != nil {
		return nil, fmt.Errorf("encode kv events: %w", w.err)
	}
	return buf.Bytes(), nil
}

// kvWriter keeps the first error, so encoding reads as the wire format.
type kvWriter struct {
	e   *msgpack.Encoder
	err error
}

func (w *kvWriter) do(f func() error) {
	if w.err == nil {
		w.err = f()
	}
}

func (w *kvWriter) arrayLen(n int) { w.do(func() error { return w.e.EncodeArrayLen(n) }) }
func (w *kvWriter) mapLen(n int)   { w.do(func() error { return w.e.EncodeMapLen(n) }) }
func (w *kvWriter) str(s string)   { w.do(func() error { return w.e.EncodeString(s) }) }
func (w *kvWriter) nil()           { w.do(w.e.EncodeNil) }
func (w *kvWriter) int(v int)      { w.do(func() error { return w.e.EncodeInt(int64(v)) }) }

func (w *kvWriter) optInt(v *int) {
	if v == nil {
		w.nil()
		return
	}
	w.int(*v)
}

func (w *kvWriter) optStr(v *string) {
	if v == nil {
		w.nil()
		return
	}
	w.str(*v)
}

func (w *kvWriter) hash(h ExternalBlockHash) {
	if h.isBytes {
		w.do(func() error { return w.e.EncodeBytes(append([]byte{}, h.raw...)) })
		return
	}
	w.do(func() error { return w.e.EncodeUint(h.low) })
}

func (w *kvWriter) optHash(h *ExternalBlockHash) {
	if h == nil {
		w.nil()
		return
	}
	w.hash(*h)
}

func (w *kvWriter) hashes(hs []ExternalBlockHash) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *kvWriter) extraKeys(keys []ExtraKeys) error {
	if keys == nil {
		w.nil()
		return nil
	}
	w.arrayLen(len(keys))
	for i, k := range keys {
		if k == nil {
			w.nil()
			continue
		}
		if err := w.value([]any(k)); err != nil {
			return fmt.Errorf("extra_keys[%d]: %w", i, err)
		}
	}
	return nil
}

func (w *kvWriter) value(v any) error {
	switch x := v.(type) {
	case nil:
		w.nil()
	case bool:
		w.do(func() error { return w.e.EncodeBool(x) })
	case string:
		w.str(x)
	case []byte:
		w.do(func() error { return w.e.EncodeBytes(x) })
	case int:
		w.int(x)
	case int64:
		w.do(func() error { return w.e.EncodeInt(x) })
	case uint64:
		w.do(func() error { return w.e.EncodeUint(x) })
	case float64:
		w.do(func() error { return w.e.EncodeFloat64(x) })
	case ExtraKeys:
		return w.value([]any(x))
	case []any:
		w.arrayLen(len(x))
		for _, el := range x {
			if err := w.value(el); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unsupported extra key type %T", v)
	}
	return nil
}

func (w *kvWriter) stored(e *BlockStored, enc Encoding, arrayLen int) error {
	type f struct {
		name string
		// omit is true for fields msgspec leaves out of a map (their
		// default is None and they are None).
		omit  bool
		write func() error
	}
	fields := []f{
		{"block_hashes", false, func() error { w.hashes(e.BlockHashes); return nil }},
		{"parent_block_hash", false, func() error { w.optHash(e.ParentBlockHash); return nil }},
		{"token_ids", false, func() error {
			w.arrayLen(len(e.TokenIDs))
			for _, t := range e.TokenIDs {
				w.int(t)
			}
			return nil
		}},
		{"block_size", false, func() error { w.int(e.BlockSize); return nil }},
		{"lora_id", false, func() error { w.optInt(e.LoRAID); return nil }},
		{"medium", false, func() error { w.optStr(e.Medium); return nil }},
		{"lora_name", false, func() error { w.optStr(e.LoRAName); return nil }},
		{"extra_keys", e.ExtraKeys == nil, func() error { return w.extraKeys(e.ExtraKeys) }},
		{"group_idx", e.GroupIdx == nil, func() error { w.optInt(e.GroupIdx); return nil }},
		{"kv_cache_spec_kind", e.KVCacheSpecKind == nil, func() error { w.optStr(e.KVCacheSpecKind); return nil }},
		{"kv_cache_spec_sliding_window", e.KVCacheSpecSlidingWindow == nil, func() error { w.optInt(e.KVCacheSpecSlidingWindow); return nil }},
		{"locality", e.Locality == nil, func() error { w.optStr(e.Locality); return nil }},
	}
	if enc == EncodingArray {
		w.arrayLen(arrayLen)
		w.str(TagBlockStored)
		for _, fl := range fields[:arrayLen-1] {
			if err := fl.write(); err != nil {
				return err
			}
		}
		return nil
	}
	n := 1
	for _, fl := range fields {
		if !fl.omit {
			n++
		}
	}
	w.mapLen(n)
	w.str("type")
	w.str(TagBlockStored)
	for _, fl := range fields {
		if fl.omit {
			continue
		}
		w.str(fl.name)
		if err := fl.write(); err != nil {
			return err
		}
	}
	return nil
}

func (w *kvWriter) removed(e *BlockRemoved, enc Encoding, arrayLen int) error {
	if enc == EncodingArray {
		w.arrayLen(arrayLen)
		w.str(TagBlockRemoved)
		fields := []func(){
			func() { w.hashes(e.BlockHashes) },
			func() { w.optStr(e.Medium) },
			func() { w.optInt(e.GroupIdx) },
			func() { w.optStr(e.Locality) },
		}
		for _, write := range fields[:arrayLen-1] {
			write()
		}
		return nil
	}
	n := 3
	if e.GroupIdx != nil {
		n++
	}
	if e.Locality != nil {
		n++
	}
	w.mapLen(n)
	w.str("type")
	w.str(TagBlockRemoved)
	w.str("block_hashes")
	w.hashes(e.BlockHashes)
	w.str("medium")
	w.optStr(e.Medium)
	if e.GroupIdx != nil {
		w.str("group_idx")
		w.int(*e.GroupIdx)
	}
	if e.Locality != nil {
		w.str("locality")
		w.str(*e.Locality)
	}
	return nil
}
