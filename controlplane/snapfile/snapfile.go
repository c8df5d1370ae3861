// Package snapfile is the format of llmgw's backup files (design §13.4): what
// `llmgwctl snapshot save` writes, `restore` sends back and `inspect` reads.
//
// A file is a fixed header followed by the body, which is the FSM's snapshot
// (a marshaled llmgwv1.State) byte for byte:
//
//	offset  size  field
//	0       8     magic "LLMGWSNP"
//	8       2     file format version, big-endian (1)
//	10      2     reserved, zero
//	12      8     revision of the state, big-endian
//	20      8     body length in bytes, big-endian
//	28      32    SHA-256 of the body
//	60      ...   body
//
// The checksum and the length are what let a restore refuse a truncated or
// damaged file before anything reaches Raft: a backup is read at the worst
// moment, often after being copied around, and a state restored from a bad
// one would replace a good cluster's with garbage.
package snapfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic opens every snapshot file.
const Magic = "LLMGWSNP"

// Version is the file format this build writes and the newest it reads.
const Version = 1

// HeaderSize is the length of the header before the body.
const HeaderSize = 60

// MaxBody bounds the body a reader accepts, so a damaged length field cannot
// make it allocate without limit. Desired state is small (models, nodes,
// replicas): 256 MiB is far above any real cluster.
const MaxBody = 256 << 20

// ErrCorrupt is a file that is not a whole, intact snapshot file: wrong
// magic, truncated, a checksum that does not match, bytes after the body.
var ErrCorrupt = errors.New("snapshot file is corrupt")

// ErrVersion is a file written by a newer format than this build reads.
var ErrVersion = errors.New("snapshot file format is newer than this build reads")

// Header is what a file says about its body.
type Header struct {
	Version  uint16
	Revision uint64
	Length   uint64
	SHA256   [32]byte
}

// Encode returns the file for a body at revision.
func Encode(revision uint64, body []byte) []byte {
	out := make([]byte, HeaderSize, HeaderSize+len(body))
	copy(out, Magic)
	binary.BigEndian.PutUint16(out[8:], Version)
	binary.BigEndian.PutUint64(out[12:], revision)
	binary.BigEndian.PutUint64(out[20:], uint64(len(body)))
	sum := sha256.Sum256(body)
	copy(out[28:], sum[:])
	return append(out, body...)
}

// ParseHeader checks a header — magic, format version, reserved field —
// and returns it. It does not look at the body.
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: %d bytes is shorter than the %d-byte header", ErrCorrupt, len(b), HeaderSize)
	}
	if !bytes.Equal(b[:8], []byte(Magic)) {
		return h, fmt.Errorf("%w: not an llmgw snapshot (magic %q, want %q)", ErrCorrupt, b[:8], Magic)
	}
	h.Version = binary.BigEndian.Uint16(b[8:])
	if h.Version == 0 {
		return h, fmt.Errorf("%w: format version 0", ErrCorrupt)
	}
	if h.Version > Version {
		return h, fmt.Errorf("%w: format %d, this build reads up to %d", ErrVersion, h.Version, Version)
	}
	if r := binary.BigEndian.Uint16(b[10:]); r != 0 {
		return h, fmt.Errorf("%w: reserved header field is %d, want 0", ErrCorrupt, r)
	}
	h.Revision = binary.BigEndian.Uint64(b[12:])
	h.Length = binary.BigEndian.Uint64(b[20:])
	copy(h.SHA256[:], b[28:HeaderSize])
	return h, nil
}

// Decode checks a whole file and returns its header and body (a sub-slice
// of file). Any error wraps ErrCorrupt or ErrVersion and says what is wrong.
func Decode(file []byte) (Header, []byte, error) {
	h, err := ParseHeader(file)
	if err != nil {
		return h, nil, err
	}
	body := file[HeaderSize:]
	if h.Length > MaxBody {
		return h, nil, fmt.Errorf("%w: body length %d is above the %d-byte limit", ErrCorrupt, h.Length, MaxBody)
	}
	if uint64(len(body)) != h.Length {
		return h, nil, fmt.Errorf("%w: header says %d body bytes, file has %d (truncated or extended)", ErrCorrupt, h.Length, len(body))
	}
	if sum := sha256.Sum256(body); sum != h.SHA256 {
		return h, nil, fmt.Errorf("%w: body checksum %x does not match the header's %x", ErrCorrupt, sum[:8], h.SHA256[:8])
	}
	return h, body, nil
}

// ReadAll reads a whole file from r, refusing one larger than a header plus
// MaxBody, and decodes it. It is Read with MaxBody.
func ReadAll(r io.Reader) (Header, []byte, error) { return Read(r, MaxBody) }

// Read reads a file from r header first (design §11 "Limits"): the header
// is checked — magic, version, a declared length of at most maxBody — before
// any of the body is read, so a stream of garbage is refused after
// HeaderSize bytes; the body is then read up to its declared length, the
// buffer growing with the bytes that actually arrive (a header that lies
// about its length costs only what was sent), and must be followed by the
// end of r and match its checksum. maxBody above MaxBody is MaxBody.
func Read(r io.Reader, maxBody uint64) (Header, []byte, error) {
	maxBody = min(maxBody, MaxBody)
	head := make([]byte, HeaderSize)
	if n, err := io.ReadFull(r, head); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Header{}, nil, fmt.Errorf("%w: %d bytes is shorter than the %d-byte header", ErrCorrupt, n, HeaderSize)
		}
		return Header{}, nil, fmt.Errorf("read snapshot file: %w", err)
	}
	h, err := ParseHeader(head)
	if err != nil {
		return h, nil, err
	}
	if h.Length > maxBody {
		return h, nil, fmt.Errorf("%w: body length %d is above the %d-byte limit", ErrCorrupt, h.Length, maxBody)
	}
	var body bytes.Buffer
	n, err := io.Copy(&body, io.LimitReader(r, int64(h.Length)))
	if err != nil {
		return h, nil, fmt.Errorf("read snapshot file: %w", err)
	}
	if uint64(n) != h.Length {
		return h, nil, fmt.Errorf("%w: header says %d body bytes, file has %d (truncated)", ErrCorrupt, h.Length, n)
	}
	var extra [1]byte
	if k, err := io.ReadFull(r, extra[:]); k > 0 {
		return h, nil, fmt.Errorf("%w: bytes after the %d-byte body (extended)", ErrCorrupt, h.Length)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return h, nil, fmt.Errorf("read snapshot file: %w", err)
	}
	if sum := sha256.Sum256(body.Bytes()); sum != h.SHA256 {
		return h, nil, fmt.Errorf("%w: body checksum %x does not match the header's %x", ErrCorrupt, sum[:8], h.SHA256[:8])
	}
	return h, body.Bytes(), nil
}
