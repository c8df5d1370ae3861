package vllm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
)

// HashAlgoSHA256CBOR is the only --prefix-caching-hash-algo whose hashes can
// be reproduced outside Python: vLLM's default "sha256" hashes a pickle.
const HashAlgoSHA256CBOR = "sha256_cbor"

// BlockHash is a prefix-cache block hash as vLLM computes it with
// sha256_cbor: a digest chained over every full block before it, so equal
// hashes mean equal prefixes.
type BlockHash [32]byte

// Uint64 is the hash as vLLM's KV events carry it by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the digest's last 8 bytes read
// big-endian.
func (h BlockHash) Uint64() uint64 { return binary.BigEndian.Uint64(h[24:]) }

func (h BlockHash) String() string { return hex.EncodeToString(h[:]) }

// NoneHash is the parent of a prompt's first block: the sha256 of the CBOR
// of the PYTHONHASHSEED string. vLLM draws it at random when PYTHONHASHSEED
// is unset, which is why every replica of a model must be given the same
// seed for hashes to agree across replicas and with the router.
func NoneHash(pythonHashSeed string) BlockHash {
	var e cborEncoder
	e.text(pythonHashSeed)
	return sha256.Sum256(e.buf)
}

// HashBlock hashes one full block: sha256 over canonical CBOR of
// (parent, tokens, extraKeys). A nil extraKeys is CBOR null, never an empty
// array — the pitfall third-party hashers fall into. Elements of extraKeys
// may be string, []byte, any integer type, nil or []any (a tuple);
// anything else is an error rather than a silently different hash.
func HashBlock(parent BlockHash, tokens []int, extraKeys []any) (BlockHash, error) {
	var e cborEncoder
	e.head(4, 3)
	e.bytes(parent[:])
	e.head(4, uint64(len(tokens)))
	for _, t := range tokens {
		e.int(int64(t))
	}
	if extraKeys == nil {
		e.null()
	} else if err := e.value(extraKeys); err != nil {
		return BlockHash{}, fmt.Errorf("hash block: extra keys: %w", err)
	}
	return sha256.Sum256(e.buf), nil
}

// ExtraKeysFunc returns the extra keys of the block starting at token
// start, or nil for none.
type ExtraKeysFunc func(block, start int) []any

// RequestExtraKeys is vLLM's generate_block_hash_extra_keys for text
// requests: the adapter's name on every block when loraName is set, then
// the cache salt on the first block only.
func RequestExtraKeys(loraName, cacheSalt string) ExtraKeysFunc {
	if loraName == "" && cacheSalt == "" {
		return nil
	}
	return func(_, start int) []any {
		var keys []any
		if loraName != "" {
			keys = append(keys, loraName)
		}
		if cacheSalt != "" && start == 0 {
			keys = append(keys, cacheSalt)
		}
		return keys
	}
}

// BlockHashes hashes the full blocks of tokens, chained from parent (a
// NoneHash for a whole prompt). A trailing partial block is not hashed:
// vLLM caches only full blocks. extra may be nil.
func BlockHashes(parent BlockHash, tokens []int, blockSize int, extra ExtraKeysFunc) ([]BlockHash, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("block hashes: block size %d: must be positive", blockSize)
	}
	n := len(tokens) / blockSize
	out := make([]BlockHash, 0, n)
	for i := range n {
		start := i * blockSize
		var keys []any
		if extra != nil {
			keys = extra(i, start)
		}
		h, err := HashBlock(parent, tokens[start:start+blockSize], keys)
		if err != nil {
			return nil, fmt.Errorf("block hashes: block %d: %w", i, err)
		}
		out = append(out, h)
		parent = h
	}
	return out, nil
}

// cborEncoder writes the subset of canonical CBOR (RFC 8949 §4.2, as
// cbor2's canonical=True) that block hashing needs: integers, byte and
// text strings, arrays and null. Canonical mode changes only floats, maps
// and sets, none of which occur here, so minimal-length heads suffice.
type cborEncoder struct{ buf []byte }

func (e *cborEncoder) head(major byte, n uint64) {
	m := major << 5
	switch {
	case n < 24:
		e.buf = append(e.buf, m|byte(n))
	case n <= math.MaxUint8:
		e.buf = append(e.buf, m|24, byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, m|25), uint16(n))
	case n <= math.MaxUint32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, m|26), uint32(n))
	default:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, m|27), n)
	}
}

func (e *cborEncoder) int(v int64) {
	if v >= 0 {
		e.head(0, uint64(v))
		return
	}
	e.head(1, uint64(-(v + 1)))
}

func (e *cborEncoder) bytes(b []byte) { e.head(2, uint64(len(b))); e.buf = append(e.buf, b...) }
func (e *cborEncoder) text(s string)  { e.head(3, uint64(len(s))); e.buf = append(e.buf, s...) }
func (e *cborEncoder) null()          { e.buf = append(e.buf, 0xf6) }

func (e *cborEncoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.null()
	case string:
		e.text(x)
	case []byte:
		e.bytes(x)
	case int:
		e.int(int64(x))
	case int32:
		e.int(int64(x))
	case int64:
		e.int(x)
	case uint32:
		e.head(0, uint64(x))
	case uint64:
		e.head(0, x)
	case []any:
		e.head(4, uint64(len(x)))
		for _, el := range x {
			if err := e.value(el); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unsupported type %T", v)
	}
	return nil
}
