package snapfile

import (
	"bytes"
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRoundTrip(t *testing.T) {
	for _, body := range [][]byte{nil, {}, []byte("state"), bytes.Repeat([]byte{0xAB}, 100000)} {
		f := Encode(42, body)
		h, got, err := Decode(f)
		if err != nil {
			t.Fatalf("decode %d-byte body: %v", len(body), err)
		}
		if h.Revision != 42 || h.Version != Version || h.Length != uint64(len(body)) || !bytes.Equal(got, body) {
			t.Fatalf("got header %+v body %d bytes, want revision 42, %d bytes", h, len(got), len(body))
		}
		if _, _, err := ReadAll(bytes.NewReader(f)); err != nil {
			t.Fatalf("ReadAll: %v", err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode(7, []byte("the desired state"))
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		file []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"short header", good[:HeaderSize-1], ErrCorrupt},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'X'; return b }), ErrCorrupt},
		{"version 0", mut(func(b []byte) []byte { b[9] = 0; return b }), ErrCorrupt},
		{"newer version", mut(func(b []byte) []byte { b[9] = Version + 1; return b }), ErrVersion},
		{"reserved set", mut(func(b []byte) []byte { b[11] = 1; return b }), ErrCorrupt},
		{"truncated body", good[:len(good)-1], ErrCorrupt},
		{"trailing bytes", append(bytes.Clone(good), 0), ErrCorrupt},
		{"flipped body bit", mut(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), ErrCorrupt},
		{"flipped checksum bit", mut(func(b []byte) []byte { b[30] ^= 1; return b }), ErrCorrupt},
		{"huge length", mut(func(b []byte) []byte { b[20] = 0xff; return b }), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Decode(tc.file); !errors.Is(err, tc.want) {
				t.Fatalf("Decode: got %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzDecode: any input is either refused with ErrCorrupt/ErrVersion or is
// a file whose body re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(1, []byte("x")))
	f.Add(Encode(0, nil))
	f.Add([]byte(Magic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, body, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if !bytes.Equal(Encode(h.Revision, body), b) {
			t.Fatal("a decoded file does not re-encode to itself")
		}
	})
}
