package vllm

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// Inputs of the golden vectors (../shared/vectors/vllm-kvevents.md).
const (
	vectorTS      = 1700000000.5
	vectorHash    = 3236607068019569386 // tokens 1..16, seed "0", no extra keys
	vectorLoRAKey = 4263176908214434802 // the same with extra key ("sql-adapter",)
)

func tokens1to16() []int {
	t := make([]int, 16)
	for i := range t {
		t[i] = i + 1
	}
	return t
}

func readVector(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "kvevents", name+".hex"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func vectorStored(h ExternalBlockHash) *BlockStored {
	return &BlockStored{
		BlockHashes: []ExternalBlockHash{h}, TokenIDs: tokens1to16(), BlockSize: 16,
		Medium: Ptr(MediumGPU), ExtraKeys: []ExtraKeys{nil}, GroupIdx: Ptr(0),
		KVCacheSpecKind: Ptr(KVCacheSpecFullAttention),
	}
}

func vectorBatch(events ...Event) EventBatch {
	return EventBatch{TS: vectorTS, Events: events, DataParallelRank: Ptr(0)}
}

func threeEvents() EventBatch {
	h := IntBlockHash(vectorHash)
	return vectorBatch(vectorStored(h),
		&BlockRemoved{BlockHashes: []ExternalBlockHash{h}, Medium: Ptr(MediumGPU), GroupIdx: Ptr(0)},
		&AllBlocksCleared{})
}

func goldenCases(t testing.TB) []struct {
	name string
	enc  Encoding
	want EventBatch
} {
	digest, err := hex.DecodeString("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")
	if err != nil {
		t.Fatal(err)
	}
	lora := vectorStored(IntBlockHash(vectorLoRAKey))
	lora.LoRAID, lora.LoRAName = Ptr(1), Ptr("sql-adapter")
	lora.ExtraKeys = []ExtraKeys{{"sql-adapter"}}
	return []struct {
		name string
		enc  Encoding
		want EventBatch
	}{
		{"a-array", EncodingArray, threeEvents()},
		{"b-map", EncodingMap, threeEvents()},
		{"c-map-lora", EncodingMap, vectorBatch(lora)},
		{"d-map-bytes", EncodingMap, vectorBatch(vectorStored(BytesBlockHash(digest)))},
	}
}

func TestEventBatchGolden(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			payload := readVector(t, tc.name)
			got, err := DecodeEventBatch(payload)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("decode:\n got %#v\nwant %#v", got, tc.want)
			}
			enc, err := EncodeEventBatch(tc.want, tc.enc)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(enc, payload) {
				t.Errorf("encode:\n got %x\nwant %x", enc, payload)
			}
		})
	}
}

// The vectors' hashes are the ones BlockHashes computes, in both forms.
func TestEventHashesMatchBlockHashes(t *testing.T) {
	plain, err := BlockHashes(NoneHash("0"), tokens1to16(), 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	withLoRA, err := BlockHashes(NoneHash("0"), tokens1to16(), 16, RequestExtraKeys("sql-adapter", ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		digest BlockHash
		want   uint64
	}{
		{"plain", plain[0], vectorHash},
		{"lora", withLoRA[0], vectorLoRAKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asInt, asBytes := ExternalHash(tc.digest, true), ExternalHash(tc.digest, false)
			if asInt.Uint64() != tc.want || asBytes.Uint64() != tc.want {
				t.Errorf("Uint64: int form %d, bytes form %d, want %d", asInt.Uint64(), asBytes.Uint64(), tc.want)
			}
			if !asInt.Matches(tc.digest) || !asBytes.Matches(tc.digest) {
				t.Error("Matches(own digest) is false")
			}
			if d, ok := asBytes.Digest(); !ok || d != tc.digest {
				t.Errorf("Digest() = %v, %v", d, ok)
			}
			if _, ok := asInt.Digest(); ok {
				t.Error("an int hash has no digest")
			}
			if asInt == asBytes || asInt.IsBytes() || !asBytes.IsBytes() {
				t.Error("int and bytes forms must be distinct keys")
			}
			if asInt.Bytes() != nil || !bytes.Equal(asBytes.Bytes(), tc.digest[:]) {
				t.Error("Bytes()")
			}
		})
	}
}

// Every array length vLLM has shipped decodes to the fields it had.
func TestDecodeLegacyArrayLengths(t *testing.T) {
	full := threeEvents()
	for _, tc := range []struct {
		stored, removed int
	}{{6, 2}, {7, 3}, {8, 3}, {9, 3}, {10, 4}, {12, 4}} {
		payload, err := EncodeEventBatch(full, EncodingArray, WithArrayLengths(tc.stored, tc.removed))
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeEventBatch(payload)
		if err != nil {
			t.Fatalf("lengths %d/%d: %v", tc.stored, tc.removed, err)
		}
		s := *full.Events[0].(*BlockStored)
		clearFrom := []func(){
			6:  func() { s.Medium = nil },
			7:  func() { s.LoRAName = nil },
			8:  func() { s.ExtraKeys = nil },
			9:  func() { s.GroupIdx = nil },
			10: func() { s.KVCacheSpecKind, s.KVCacheSpecSlidingWindow = nil, nil },
			11: func() {},
			12: func() {},
		}
		for i := tc.stored; i < len(clearFrom); i++ {
			if clearFrom[i] != nil {
				clearFrom[i]()
			}
		}
		r := *full.Events[1].(*BlockRemoved)
		if tc.removed < 3 {
			r.Medium = nil
		}
		if tc.removed < 4 {
			r.GroupIdx = nil
		}
		want := vectorBatch(&s, &r, &AllBlocksCleared{})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("lengths %d/%d:\n got %#v\nwant %#v", tc.stored, tc.removed, got, want)
		}
		if !got.Events[0].(*BlockStored).OnGPU() || !got.Events[1].(*BlockRemoved).OnGPU() {
			t.Errorf("lengths %d/%d: a block with medium GPU or none is on the GPU", tc.stored, tc.removed)
		}
	}
}

// omap is an ordered map for hand-made payloads.
type omap [][2]any

func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	var enc func(v any)
	enc = func(v any) {
		var err error
		switch x := v.(type) {
		case omap:
			err = e.EncodeMapLen(len(x))
			for _, kv := range x {
				enc(kv[0])
				enc(kv[1])
			}
		case []any:
			err = e.EncodeArrayLen(len(x))
			for _, el := range x {
				enc(el)
			}
		case int:
			err = e.EncodeInt(int64(x))
		case uint64:
			err = e.EncodeUint(x)
		case float64:
			err = e.EncodeFloat64(x)
		case raw:
			_, err = buf.Write(x)
		default:
			err = e.Encode(v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	enc(v)
	return buf.Bytes()
}

// raw is msgpack written as is.
type raw []byte

func TestDecodeShapes(t *testing.T) {
	h := IntBlockHash(vectorHash)
	removed := func(hs ...ExternalBlockHash) *BlockRemoved {
		return &BlockRemoved{BlockHashes: hs, Medium: Ptr(MediumGPU)}
	}
	for _, tc := range []struct {
		name    string
		payload any
		want    EventBatch
	}{
		{"two-element batch", []any{1.5, []any{[]any{"AllBlocksCleared"}}},
			EventBatch{TS: 1.5, Events: []Event{&AllBlocksCleared{}}}},
		{"nil rank, integer ts", []any{2, []any{}, nil}, EventBatch{TS: 2}},
		{"extra batch field", []any{1.0, []any{}, 3, "future"}, EventBatch{TS: 1, DataParallelRank: Ptr(3)}},
		{"unknown array event skipped", []any{1.0, []any{
			[]any{"BlockPinned", []any{1, 2}, omap{{"x", 1}}}, []any{"BlockRemoved", []any{uint64(vectorHash)}, "GPU"}}, 0},
			EventBatch{TS: 1, Events: []Event{removed(h)}, DataParallelRank: Ptr(0), Skipped: []string{"BlockPinned"}}},
		{"unknown map event skipped, with fields of other types", []any{1.0, []any{
			omap{{"type", "Offloaded"}, {"block_hashes", "not a list"}}, omap{{"type", "AllBlocksCleared"}}}, 0},
			EventBatch{TS: 1, Events: []Event{&AllBlocksCleared{}}, DataParallelRank: Ptr(0), Skipped: []string{"Offloaded"}}},
		{"map: unknown keys ignored, type not first", []any{1.0, []any{
			omap{{"block_hashes", []any{uint64(vectorHash)}}, {"future", omap{{"a", []any{1, 2, 3}}}},
				{"medium", "GPU"}, {"type", "BlockRemoved"}, {7, "non-string key"}}}, 0},
			EventBatch{TS: 1, Events: []Event{removed(h)}, DataParallelRank: Ptr(0)}},
		{"array: fields newer than the decoder ignored", []any{1.0, []any{
			[]any{"BlockRemoved", []any{uint64(vectorHash)}, "GPU", nil, "LOCAL", "newer"}}, 0},
			EventBatch{TS: 1, Events: []Event{&BlockRemoved{BlockHashes: []ExternalBlockHash{h}, Medium: Ptr(MediumGPU),
				Locality: Ptr("LOCAL")}}, DataParallelRank: Ptr(0)}},
		{"small and negative int hashes", []any{1.0, []any{[]any{"BlockRemoved", []any{5, -2}, "CPU"}}, 0},
			EventBatch{TS: 1, Events: []Event{&BlockRemoved{BlockHashes: []ExternalBlockHash{IntBlockHash(5),
				IntBlockHash(^uint64(1))}, Medium: Ptr(MediumCPU)}}, DataParallelRank: Ptr(0)}},
		{"multimodal extra keys", []any{1.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", []any{1}},
			{"parent_block_hash", 9}, {"token_ids", []any{}}, {"block_size", 16},
			{"extra_keys", []any{[]any{"img", []any{"abc", 3}}, nil, []any{}}}}}, 0},
			EventBatch{TS: 1, Events: []Event{&BlockStored{BlockHashes: []ExternalBlockHash{IntBlockHash(1)},
				ParentBlockHash: Ptr(IntBlockHash(9)), TokenIDs: []int{}, BlockSize: 16,
				ExtraKeys: []ExtraKeys{{"img", []any{"abc", int64(3)}}, nil, {}}}}, DataParallelRank: Ptr(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeEventBatch(mp(t, tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("\n got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	a := readVector(t, "a-array")
	for _, tc := range []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "empty payload"},
		{"not an array", mp(t, omap{{"ts", 1}}), "array"},
		{"one element", mp(t, []any{1.0}), "batch of 1"},
		{"ts not a number", mp(t, []any{"now", []any{}}), "ts"},
		{"truncated", a[:len(a)-3], ""},
		{"trailing bytes", append(append([]byte{}, a...), 0xc0), "after the batch"},
		{"short BlockStored", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}}), "at least 6"},
		{"map BlockStored without token_ids", mp(t, []any{1.0, []any{omap{{"type", "BlockStored"},
			{"block_hashes", []any{1}}, {"block_size", 16}}}}), "missing token_ids"},
		{"map without type", mp(t, []any{1.0, []any{omap{{"block_hashes", []any{1}}}}}), "without a type"},
		{"hash of wrong type", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"abc"}}}}), "block_hashes[0]"},
		{"token id not an int", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1.5}, 16, nil}}}), "token_ids[0]"},
		{"extra keys too deep", mp(t, []any{1.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", []any{1}},
			{"token_ids", []any{}}, {"block_size", 1},
			{"extra_keys", []any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{}}}}}}}}}}}}}}), "deeper"},
		{"deeply nested unknown field", append(mp(t, raw{0x92, 0x01, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e',
			0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xa1, 'x'}), bytes.Repeat([]byte{0x91}, 100000)...), "remaining bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeEventBatch(tc.payload)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrMalformedBatch) {
				t.Errorf("%v does not wrap ErrMalformedBatch", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// A length header claiming far more than the payload holds is refused
// before anything is allocated for it.
func TestDecodeHostileLengths(t *testing.T) {
	ts := []byte{0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0x20, 0, 0}
	batch := func(rest ...byte) []byte { return append(append([]byte{0x93}, ts...), rest...) }
	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		{"array32 batch", []byte{0xdd, 0x80, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
		{"array32 events", batch(0xdd, 0x80, 0, 0, 0, 0x90, 0)},
		{"map32 event", batch(0x91, 0xdf, 0x80, 0, 0, 0, 0, 0)},
		{"bin32 hash", batch(0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd',
			0x91, 0xc6, 0x80, 0, 0, 0, 1, 2)},
		{"str32 tag", batch(0x91, 0x91, 0xdb, 0x80, 0, 0, 0, 'B')},
		{"array32 token ids", batch(0x91, 0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
			0x90, 0xc0, 0xdd, 0x80, 0, 0, 0, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeEventBatch(tc.payload); err == nil {
				t.Fatal("no error")
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			const runs = 10
			for range runs {
				_, _ = DecodeEventBatch(tc.payload)
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 16<<10 {
				t.Errorf("decoding %d bytes allocated %d bytes per run", len(tc.payload), per)
			}
		})
	}
}

func TestEncodeOptionsAndErrors(t *testing.T) {
	b, err := EncodeEventBatch(EventBatch{TS: 1, Events: []Event{&AllBlocksCleared{}}}, EncodingArray, WithoutRank())
	if err != nil {
		t.Fatal(err)
	}
	if want := "92cb3ff00000000000009191b0416c6c426c6f636b73436c6561726564"; hex.EncodeToString(b) != want {
		t.Errorf("2-element batch: got %x want %s", b, want)
	}
	for _, tc := range []struct {
		name string
		b    EventBatch
		enc  Encoding
		opts []EncodeOption
	}{
		{"stored length", threeEvents(), EncodingArray, []EncodeOption{WithArrayLengths(13, 4)}},
		{"removed length", threeEvents(), EncodingArray, []EncodeOption{WithArrayLengths(12, 1)}},
		{"encoding", threeEvents(), Encoding(9), nil},
		{"extra key type", EventBatch{Events: []Event{&BlockStored{ExtraKeys: []ExtraKeys{{struct{}{}}}}}}, EncodingMap, nil},
		{"nil event", EventBatch{Events: []Event{nil}}, EncodingMap, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := EncodeEventBatch(tc.b, tc.enc, tc.opts...); err == nil {
				t.Error("no error")
			}
		})
	}
}

func TestParseEncoding(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Encoding
		ok   bool
	}{{"map", EncodingMap, true}, {" Array ", EncodingArray, true}, {"msgpack", 0, false}, {"", 0, false}} {
		got, err := ParseEncoding(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseEncoding(%q) = %v, %v", tc.in, got, err)
		}
		if tc.ok && got.String() != strings.ToLower(strings.TrimSpace(tc.in)) {
			t.Errorf("String() = %q", got.String())
		}
	}
}

func TestFrames(t *testing.T) {
	// Frames of the vectors' message: topic "kv-events", seq 0.
	f := PubFrames("kv-events", 0, []byte{0x93})
	if hex.EncodeToString(f[0]) != "6b762d6576656e7473" || hex.EncodeToString(f[1]) != "0000000000000000" {
		t.Errorf("frames %x", f)
	}
	topic, seq, payload, err := ParsePubFrames(PubFrames("kv", 258, []byte("p")))
	if err != nil || topic != "kv" || seq != 258 || string(payload) != "p" {
		t.Errorf("ParsePubFrames = %q %d %q %v", topic, seq, payload, err)
	}
	for _, bad := range [][][]byte{nil, {{}, {1, 2}, {}}, {{}, SeqFrame(1)}} {
		if _, _, _, err := ParsePubFrames(bad); err == nil {
			t.Errorf("ParsePubFrames(%x): no error", bad)
		}
	}

	req := ReplayRequestFrames(7)
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("client")}, req...))
	if err != nil || string(id) != "client" || start != 7 {
		t.Errorf("ParseReplayRequest = %q %d %v", id, start, err)
	}
	for _, bad := range [][][]byte{req, {[]byte("c"), {1}, SeqFrame(1)}, {[]byte("c"), {}, {1}}} {
		if _, _, err := ParseReplayRequest(bad); err == nil {
			t.Errorf("ParseReplayRequest(%x): no error", bad)
		}
	}

	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   ReplayReply
	}{
		{"with topic", ReplayReplyFrames([]byte("c"), "kv", 3, []byte("p"))[1:], ReplayReply{Topic: "kv", Seq: 3, Payload: []byte("p")}},
		{"end marker", ReplayReplyFrames([]byte("c"), "", ReplayEndSeq, nil)[1:], ReplayReply{Seq: ReplayEndSeq, End: true}},
		{"before #45177", [][]byte{{}, SeqFrame(4), []byte("p")}, ReplayReply{Seq: 4, Payload: []byte("p")}},
		{"old end marker", [][]byte{{}, SeqFrame(ReplayEndSeq), {}}, ReplayReply{Seq: ReplayEndSeq, Payload: []byte{}, End: true}},
	} {
		got, err := ParseReplayReply(tc.frames)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got.Topic != tc.want.Topic || got.Seq != tc.want.Seq || !bytes.Equal(got.Payload, tc.want.Payload) || got.End != tc.want.End {
			t.Errorf("%s: got %+v want %+v", tc.name, got, tc.want)
		}
	}
	for _, bad := range [][][]byte{{{}, SeqFrame(1)}, {{1}, SeqFrame(1), {}}, {{}, {1}, {2}}} {
		if _, err := ParseReplayReply(bad); err == nil {
			t.Errorf("ParseReplayReply(%x): no error", bad)
		}
	}
}

// denseRemoved is a batch of one BlockRemoved naming n hashes of one byte
// each (positive fixints): the densest expansion msgpack allows, each byte
// decoding into an ExternalBlockHash.
func denseRemoved(n int) []byte {
	p := []byte{0x92, 0x01, 0x91, 0x92, 0xac}
	p = append(p, "BlockRemoved"...)
	p = append(p, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(p, bytes.Repeat([]byte{0x07}, n)...)
}

// TestDecodeLimits: a batch whose headers declare more than the limits is
// refused (ErrBatchTooLarge, ErrMalformedBatch) without allocating its
// expansion (issue 27: a 16 MiB frame decoded into over 512 MB); one
// within them decodes as without limits.
func TestDecodeLimits(t *testing.T) {
	const n = 1 << 20
	dense := denseRemoved(n)
	for _, tc := range []struct {
		name    string
		lim     DecodeLimits
		payload []byte
		ok      bool
	}{
		{"no limits", DecodeLimits{}, dense, true},
		{"within both", DecodeLimits{MaxDecodedBytes: 64 << 20, MaxBlockHashes: n}, dense, true},
		{"hashes over", DecodeLimits{MaxBlockHashes: n - 1}, dense, false},
		{"bytes over", DecodeLimits{MaxDecodedBytes: n}, dense, false},
		{"token ids over", DecodeLimits{MaxDecodedBytes: 1 << 10}, mp(t, []any{1.0, []any{[]any{"BlockStored",
			[]any{1}, nil, make([]any, 200), 16, nil}}}), false},
		{"events over", DecodeLimits{MaxDecodedBytes: 1 << 10}, mp(t, []any{1.0, make([]any, 100)}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeEventBatchLimited(tc.payload, tc.lim)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBatchTooLarge) || !errors.Is(err, ErrMalformedBatch) {
				t.Fatalf("err = %v, want ErrBatchTooLarge and ErrMalformedBatch", err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, _ = DecodeEventBatchLimited(tc.payload, tc.lim)
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
				t.Errorf("the refused batch allocated %d bytes", got)
			}
		})
	}
}
