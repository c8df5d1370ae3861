package vllm

import (
	"bytes"
	"reflect"
	"testing"
)

// Engines that deviate from vLLM in small ways (issue 14) decode to the
// same events as vLLM's: a parent_block_hash of 0 is no parent, in either
// form and either encoding, and an optional field left out is the same as
// one sent as None.
func TestDecodeParentZeroIsNone(t *testing.T) {
	first := func(parent any) []any {
		return []any{"BlockStored", []any{uint64(vectorHash)}, parent, []any{1, 2}, 2, nil, "GPU"}
	}
	want := &BlockStored{BlockHashes: []ExternalBlockHash{IntBlockHash(vectorHash)}, TokenIDs: []int{1, 2},
		BlockSize: 2, Medium: Ptr(MediumGPU)}
	withParent := func(p ExternalBlockHash) *BlockStored { e := *want; e.ParentBlockHash = &p; return &e }
	for _, tc := range []struct {
		name   string
		event  any
		parent *ExternalBlockHash
	}{
		{"array: nil", first(nil), nil},
		{"array: int 0", first(0), nil},
		{"array: 32 zero bytes", first(make([]byte, 32)), nil},
		{"array: empty bytes", first([]byte{}), nil},
		{"array: int 1 is a parent", first(1), Ptr(IntBlockHash(1))},
		{"array: bytes ending in 0 with a nonzero byte is a parent",
			first(append([]byte{7}, make([]byte, 31)...)), Ptr(BytesBlockHash(append([]byte{7}, make([]byte, 31)...)))},
		{"map: int 0", omap{{"type", "BlockStored"}, {"block_hashes", []any{uint64(vectorHash)}},
			{"parent_block_hash", 0}, {"token_ids", []any{1, 2}}, {"block_size", 2}, {"medium", "GPU"}}, nil},
		{"map: absent", omap{{"type", "BlockStored"}, {"block_hashes", []any{uint64(vectorHash)}},
			{"token_ids", []any{1, 2}}, {"block_size", 2}, {"medium", "GPU"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeEventBatch(mp(t, []any{1.0, []any{tc.event}}))
			if err != nil {
				t.Fatal(err)
			}
			w := want
			if tc.parent != nil {
				w = withParent(*tc.parent)
			}
			if len(got.Events) != 1 || !reflect.DeepEqual(got.Events[0], w) {
				t.Errorf("\n got %#v\nwant %#v", got.Events, w)
			}
		})
	}
}

// Every optional field of every event, in both encodings: absent, nil, and
// (where the shape allows it) the array cut short before it decode alike.
func TestDecodeAbsentEqualsNil(t *testing.T) {
	hashes := []any{uint64(vectorHash)}
	storedOptional := []string{"parent_block_hash", "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
		"kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality"}
	removedOptional := []string{"medium", "group_idx", "locality"}
	required := map[string]omap{
		TagBlockStored:  {{"block_hashes", hashes}, {"token_ids", []any{1, 2}}, {"block_size", 2}},
		TagBlockRemoved: {{"block_hashes", hashes}},
	}
	for tag, opts := range map[string][]string{TagBlockStored: storedOptional, TagBlockRemoved: removedOptional} {
		for _, name := range opts {
			base := append(omap{{"type", tag}}, required[tag]...)
			absent := mp(t, []any{1.0, []any{base}, nil})
			withNil := mp(t, []any{1.0, []any{append(append(omap{}, base...), [2]any{name, nil})}})
			a, err := DecodeEventBatch(absent)
			if err != nil {
				t.Fatalf("%s without %s: %v", tag, name, err)
			}
			n, err := DecodeEventBatch(withNil)
			if err != nil {
				t.Fatalf("%s with %s nil: %v", tag, name, err)
			}
			if !reflect.DeepEqual(a, n) {
				t.Errorf("%s: %s absent decodes to %#v, nil to %#v", tag, name, a.Events[0], n.Events[0])
			}
		}
	}
	// Array form: every optional field nil, and the array cut before each
	// of them, decode alike.
	storedNils := []any{"BlockStored", hashes, nil, []any{1, 2}, 2, nil, nil, nil, nil, nil, nil, nil, nil}
	removedNils := []any{"BlockRemoved", hashes, nil, nil, nil}
	for _, tc := range []struct {
		full []any
		min  int
	}{{storedNils, minStoredArray}, {removedNils, minRemovedArray}} {
		want, err := DecodeEventBatch(mp(t, []any{1.0, []any{tc.full}}))
		if err != nil {
			t.Fatal(err)
		}
		for n := tc.min; n < len(tc.full); n++ {
			got, err := DecodeEventBatch(mp(t, []any{1.0, []any{tc.full[:n]}}))
			if err != nil {
				t.Fatalf("%s of %d elements: %v", tc.full[0], n, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s of %d elements:\n got %#v\nwant %#v", tc.full[0], n, got.Events[0], want.Events[0])
			}
		}
	}
}

// FuzzDecodeParentZero: whatever parent an engine sends, the decoded
// event has none exactly when it was nil or 0, and the rest of the event
// is what it would be without a parent.
func FuzzDecodeParentZero(f *testing.F) {
	f.Add(uint64(0), []byte(nil), false)
	f.Add(uint64(0), make([]byte, 32), true)
	f.Add(uint64(1), []byte{0, 1}, true)
	f.Add(uint64(vectorHash), []byte(nil), false)
	f.Fuzz(func(t *testing.T, v uint64, b []byte, asBytes bool) {
		var parent any = v
		zero := v == 0
		if asBytes {
			parent = b
			if b == nil {
				parent = []byte{}
			}
			zero = len(bytes.Trim(b, "\x00")) == 0
		}
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			var ev any = []any{"BlockStored", []any{uint64(vectorHash)}, parent, []any{1}, 1, nil}
			if enc == EncodingMap {
				ev = omap{{"type", "BlockStored"}, {"block_hashes", []any{uint64(vectorHash)}},
					{"parent_block_hash", parent}, {"token_ids", []any{1}}, {"block_size", 1}}
			}
			got, err := DecodeEventBatch(mp(t, []any{1.0, []any{ev}}))
			if err != nil {
				t.Fatalf("%v: %v", enc, err)
			}
			e := got.Events[0].(*BlockStored)
			if (e.ParentBlockHash == nil) != zero {
				t.Fatalf("%v: parent %#v decoded as %v, want none=%v", enc, parent, e.ParentBlockHash, zero)
			}
			if !zero {
				want := IntBlockHash(v)
				if asBytes {
					want = BytesBlockHash(b)
				}
				if *e.ParentBlockHash != want {
					t.Fatalf("%v: parent %v, want %v", enc, *e.ParentBlockHash, want)
				}
			}
		}
	})
}
