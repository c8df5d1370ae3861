package vllm

import (
	"errors"
	"math"
	"reflect"
	"testing"
)

// FuzzDecodeEventBatch: no payload panics or hangs the decoder; an error
// always wraps ErrMalformedBatch; and whatever decodes survives a round
// trip through the map encoding (which, unlike the array one, carries
// every field).
func FuzzDecodeEventBatch(f *testing.F) {
	for _, name := range []string{"a-array", "b-map", "c-map-lora", "d-map-bytes"} {
		p := readVector(f, name)
		f.Add(p)
		for _, n := range []int{1, 10, len(p) / 2, len(p) - 1} {
			f.Add(p[:n])
		}
	}
	f.Add([]byte{0xdd, 0x80, 0, 0, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeEventBatch(payload)
		if err != nil {
			if !errors.Is(err, ErrMalformedBatch) {
				t.Fatalf("error %v does not wrap ErrMalformedBatch", err)
			}
			return
		}
		if math.IsNaN(b.TS) {
			return // NaN != NaN; nothing else to compare
		}
		enc, err := EncodeEventBatch(b, EncodingMap)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeEventBatch(enc)
		if err != nil {
			t.Fatalf("decode of re-encoded batch: %v", err)
		}
		b.Skipped = nil
		if !reflect.DeepEqual(again, b) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", again, b)
		}
	})
}
