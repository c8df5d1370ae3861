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
			if _, _, err := Read(bytes.NewReader(tc.file), MaxBody); !errors.Is(err, tc.want) {
				t.Fatalf("Read: got %v, want %v", err, tc.want)
			}
		})
	}
}

// counting reads from an endless source, counting the bytes it handed out.
type counting struct {
	head []byte
	n    int
}

func (c *counting) Read(p []byte) (int, error) {
	k := copy(p, c.head)
	c.head = c.head[k:]
	for i := k; i < len(p); i++ {
		p[i] = 0x5A
	}
	c.n += len(p)
	return len(p), nil
}

// TestReadChecksTheHeaderFirst: a stream of garbage, or a header declaring
// more than the cap, is refused after the header, with the body unread.
func TestReadChecksTheHeaderFirst(t *testing.T) {
	big := Encode(1, nil)
	big[20] = 0x01 // 2^56 bytes declared
	capped := Encode(1, bytes.Repeat([]byte{1}, 2000))
	for _, tc := range []struct {
		name string
		head []byte
		max  uint64
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\n"), MaxBody},
		{"length beyond the format's limit", big, MaxBody},
		{"length beyond the caller's cap", capped[:HeaderSize], 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &counting{head: tc.head}
			if _, _, err := Read(src, tc.max); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Read: %v, want ErrCorrupt", err)
			}
			if src.n > HeaderSize {
				t.Fatalf("read %d bytes before refusing, want at most the %d-byte header", src.n, HeaderSize)
			}
		})
	}
}

// A header that lies about its length costs the reader only the bytes
// that arrive, not the length it declared.
func TestReadTruncatedBodyIsRefused(t *testing.T) {
	f := Encode(1, bytes.Repeat([]byte{1}, 1<<20))
	if _, _, err := Read(bytes.NewReader(f[:HeaderSize+10]), MaxBody); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a truncated body: %v, want ErrCorrupt", err)
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
		rh, rbody, rerr := Read(bytes.NewReader(b), MaxBody)
		if (err == nil) != (rerr == nil) || rh != h || !bytes.Equal(rbody, body) {
			t.Fatalf("Read and Decode disagree: %v / %v", rerr, err)
		}
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
