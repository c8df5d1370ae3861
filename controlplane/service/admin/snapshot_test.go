package admin

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/snapfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// restoreStream feeds chunks to SnapshotRestore and counts what was read.
type restoreStream struct {
	grpc.ServerStream
	chunks [][]byte
	// endless repeats filler after chunks run out, as an attacker would.
	endless bool
	recvs   int
	bytes   int
}

func (s *restoreStream) Context() context.Context { return context.Background() }

func (s *restoreStream) Recv() (*llmgwv1.SnapshotChunk, error) {
	var c []byte
	switch {
	case len(s.chunks) > 0:
		c, s.chunks = s.chunks[0], s.chunks[1:]
	case s.endless:
		c = bytes.Repeat([]byte{0x5A}, 256<<10)
	default:
		return nil, io.EOF
	}
	s.recvs++
	s.bytes += len(c)
	return &llmgwv1.SnapshotChunk{Data: c}, nil
}

func (s *restoreStream) SendAndClose(*llmgwv1.SnapshotRestoreResponse) error { return nil }

func TestRestoreRefusesBeforeTheBody(t *testing.T) {
	huge := snapfile.Encode(1, nil)
	huge[20] = 0x01 // declares 2^56 body bytes
	capped := snapfile.Encode(1, bytes.Repeat([]byte{1}, 4096))
	for _, tc := range []struct {
		name      string
		max       uint64
		chunks    [][]byte
		wantRecvs int
	}{
		// The header arrives in tiny pieces: refused once it is whole.
		{"garbage in small chunks", 0, [][]byte{[]byte("GET / HTTP/1.1\r\n"), []byte("Host: x\r\n\r\n"), bytes.Repeat([]byte{'A'}, 40)}, 3},
		{"garbage in one big chunk", 0, nil, 1},
		{"declared length beyond the format", 0, [][]byte{huge}, 1},
		{"declared length beyond the cap", 1024, [][]byte{capped[:snapfile.HeaderSize]}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New("s1", Deps{RestoreMaxBytes: tc.max}, slog.New(slog.DiscardHandler))
			s := &restoreStream{chunks: tc.chunks, endless: true}
			err := a.SnapshotRestore(s)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("restore of garbage: %v, want INVALID_ARGUMENT", err)
			}
			if s.recvs != tc.wantRecvs {
				t.Fatalf("read %d chunks (%d bytes) before refusing, want %d: the header must be checked before the body is read", s.recvs, s.bytes, tc.wantRecvs)
			}
		})
	}
}

func TestRestoreRefusesATruncatedFile(t *testing.T) {
	f := snapfile.Encode(1, bytes.Repeat([]byte{1}, 1<<20))
	a := New("s1", Deps{}, slog.New(slog.DiscardHandler))
	err := a.SnapshotRestore(&restoreStream{chunks: [][]byte{f[:snapfile.HeaderSize+100]}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("restore of a truncated file: %v, want INVALID_ARGUMENT", err)
	}
}
