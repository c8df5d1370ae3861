package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/configfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)

// start runs a writer over cfg until the test ends; stop ends it and waits.
func start(t *testing.T, cfg Config, m Metrics) (w *Writer, stop func()) {
	t.Helper()
	clock := t0
	w, err := New(cfg, slog.New(slog.DiscardHandler), m, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return w, stop
}

// read returns a capture file's header and records.
func read(t *testing.T, path string) (Header, []Record, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, 1<<20)
	var h Header
	var recs []Record
	for i := 0; sc.Scan(); i++ {
		if i == 0 {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				t.Fatalf("header %q: %v", sc.Text(), err)
			}
			continue
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %d %q: %v", i, sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return h, recs, string(b)
}

// TestSharingSurvivesTextDoesNot: two prompts sharing their first two
// blocks share their first two salted hashes and no more; no raw hash,
// session or figure that could be text appears in the file.
func TestSharingSurvivesTextDoesNot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cap.jsonl")
	w, stop := start(t, Config{Path: path}, Metrics{})
	a := []uint64{0x1111111111111111, 0x2222222222222222, 0x3333333333333333}
	b := []uint64{0x1111111111111111, 0x2222222222222222, 0x4444444444444444}
	w.Record(Request{Arrived: t0.Add(1500 * time.Millisecond), Model: "m", Tenant: "acme", API: "chat", Stream: true,
		Session: "secret-session", PromptTokens: 48, PromptBytes: 300, Unit: UnitTokens, BlockSize: 16, Hashes: a,
		Chunks: []uint64{0x5555555555555555, 0x6666666666666666}, ChunkSize: 64,
		OutputTokens: 7, CachedTokens: 32, Status: 200, TTFT: 42 * time.Millisecond, Replica: "m-0"})
	w.Record(Request{Arrived: t0.Add(2 * time.Second), Model: "m", API: "messages", Session: "secret-session", Unit: UnitTokens, BlockSize: 16, Hashes: b,
		Chunks: []uint64{0x5555555555555555, 0x7777777777777777}, ChunkSize: 64, Status: 200})
	// Tier 1's chunks are the blocks of a request tier 2 did not read:
	// not repeated beside them.
	w.Record(Request{Arrived: t0.Add(3 * time.Second), Model: "m", API: "chat", Unit: UnitBytes, BlockSize: 64, Hashes: []uint64{0x5555555555555555},
		Chunks: []uint64{0x5555555555555555}, ChunkSize: 64, Status: 200})
	stop()
	h, recs, raw := read(t, path)
	if h.Capture != Version || !h.Started.Equal(t0) || len(h.Salt) != 16 {
		t.Fatalf("header %+v", h)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	r, s, u := recs[0], recs[1], recs[2]
	if r.T != 1.5 || r.Model != "m" || r.Tenant != "acme" || !r.Stream || r.PromptTokens != 48 || r.OutputTokens != 7 ||
		r.CachedTokens != 32 || r.TTFTMs != 42 || r.BlockSize != 16 || r.Unit != UnitTokens || r.Replica != "m-0" {
		t.Fatalf("record %+v", r)
	}
	if r.Blocks[0] != s.Blocks[0] || r.Blocks[1] != s.Blocks[1] || r.Blocks[2] == s.Blocks[2] {
		t.Fatalf("blocks %v and %v: want the first two shared, the third not", r.Blocks, s.Blocks)
	}
	if r.ChunkSize != 64 || len(r.Chunks) != 2 || len(s.Chunks) != 2 || r.Chunks[0] != s.Chunks[0] || r.Chunks[1] == s.Chunks[1] {
		t.Fatalf("chunks %v and %v (size %d): want two each, the first shared, the second not", r.Chunks, s.Chunks, r.ChunkSize)
	}
	if u.Unit != UnitBytes || len(u.Blocks) != 1 || u.Blocks[0] != r.Chunks[0] || u.Chunks != nil {
		t.Fatalf("tier 1's record %+v: want its one chunk as its blocks, salted as the others' chunks are, and no chunks beside", u)
	}
	if r.Session == "" || r.Session != s.Session {
		t.Fatalf("sessions %q, %q: want one salted value", r.Session, s.Session)
	}
	for _, leak := range []string{"secret-session", "1111111111111111", fmt.Sprint(a[0]), "2222222222222222", "5555555555555555", "6666666666666666"} {
		if strings.Contains(raw, leak) {
			t.Fatalf("the file holds %q:\n%s", leak, raw)
		}
	}
}

// TestSaltIsPerCapture: the same prompt captured by two writers hashes
// differently, so captures cannot be joined with each other.
func TestSaltIsPerCapture(t *testing.T) {
	var blocks []string
	for range 2 {
		path := filepath.Join(t.TempDir(), "cap.jsonl")
		w, stop := start(t, Config{Path: path}, Metrics{})
		w.Record(Request{Arrived: t0, Model: "m", Unit: UnitTokens, BlockSize: 16, Hashes: []uint64{7}})
		stop()
		_, recs, _ := read(t, path)
		blocks = append(blocks, recs[0].Blocks[0])
	}
	if blocks[0] == blocks[1] {
		t.Fatalf("two captures salted a block alike: %v", blocks)
	}
}

// TestRotationBoundsTheFiles: past MaxBytes a file is rotated; at most
// MaxFiles are kept beside the current one; every file starts with the
// header.
func TestRotationBoundsTheFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cap.jsonl")
	var rotations atomic.Int64
	w, stop := start(t, Config{Path: path, MaxBytes: 1 << 20, MaxFiles: 2}, Metrics{Rotations: func() { rotations.Add(1) }})
	hashes := make([]uint64, 256) // ~4.6 KB a record
	deadline := time.Now().Add(time.Minute)
	for i := range 1200 {
		for len(w.queue) == cap(w.queue) { // let the writer catch up: this test counts rotations, not drops
			if time.Now().After(deadline) {
				t.Fatalf("the writer took no record for a minute (%d queued)", len(w.queue))
			}
			time.Sleep(time.Millisecond)
		}
		w.Record(Request{Arrived: t0.Add(time.Duration(i) * time.Millisecond), Model: "m", Unit: UnitTokens, BlockSize: 16, Hashes: hashes})
	}
	stop()
	if n := rotations.Load(); n < 4 {
		t.Fatalf("%d rotations for ~5.5 MB in files of 1 MiB, want at least 4", n)
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) != 3 {
		t.Fatalf("files %v, want the current one and 2 rotated", files)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 1<<20+8<<10 {
			t.Fatalf("%s is %d bytes, past the bound", f, st.Size())
		}
		if h, _, _ := read(t, f); h.Capture != Version {
			t.Fatalf("%s starts without the header", f)
		}
	}
}

// TestFullQueueDrops: the request path never waits for the writer.
func TestFullQueueDrops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cap.jsonl")
	var dropped atomic.Int64
	w, err := New(Config{Path: path, Queue: 2}, slog.New(slog.DiscardHandler), Metrics{Dropped: func() { dropped.Add(1) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Not running: the queue fills after 2.
	for range 5 {
		w.Record(Request{Model: "m"})
	}
	if dropped.Load() != 3 {
		t.Fatalf("%d dropped, want 3", dropped.Load())
	}
	var nilWriter *Writer
	nilWriter.Record(Request{}) // a router without capture
}

// TestRestartRotatesTheOldFile: a router restarted with the same path
// does not append a second salt to the first capture's file.
func TestRestartRotatesTheOldFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cap.jsonl")
	for range 2 {
		w, stop := start(t, Config{Path: path}, Metrics{})
		w.Record(Request{Arrived: t0, Model: "m"})
		stop()
	}
	h1, r1, _ := read(t, path)
	h0, r0, _ := read(t, path+".1")
	if len(r1) != 1 || len(r0) != 1 || h0.Salt == h1.Salt {
		t.Fatalf("files: %+v %d records, %+v %d records; want one each, two salts", h1, len(r1), h0, len(r0))
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{Path: filepath.Join(dir, "c.jsonl")}.WithDefaults(), ""},
		{Config{Path: filepath.Join(dir, "c.jsonl"), MaxBytes: 10, MaxFiles: 1, Queue: 1}, "capture_max_bytes: must be at least 1 MiB"},
		{Config{Path: filepath.Join(dir, "c.jsonl"), MaxBytes: 1 << 20, MaxFiles: -1, Queue: 1}, "capture_max_files: must be within [0, 100]"},
		{Config{Path: filepath.Join(dir, "c.jsonl"), MaxBytes: 1 << 20, Queue: 0}, "capture_queue: must be within"},
		{Config{Path: filepath.Join(dir, "missing", "c.jsonl"), MaxBytes: 1 << 20, Queue: 1}, "--capture-path (capture_path): "},
	} {
		var p configfile.Problems
		tc.cfg.Validate(&p)
		err := p.Err()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// BenchmarkRecord is the writer's salting and shaping of one record of a
// 1,100-token prompt: 69 tier-2 blocks and 91 tier-1 chunks, as the
// replay bench's shared-prefix requests have.
func BenchmarkRecord(b *testing.B) {
	w, err := New(Config{Path: filepath.Join(b.TempDir(), "c")}, slog.New(slog.DiscardHandler), Metrics{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := Request{Arrived: time.Now(), Model: "m", API: "chat", PromptTokens: 1115, PromptBytes: 5997, Unit: UnitTokens, BlockSize: 16,
		Hashes: make([]uint64, 69), Chunks: make([]uint64, 91), ChunkSize: 64, OutputTokens: 32, Status: 200}
	for i := range r.Hashes {
		r.Hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for i := range r.Chunks {
		r.Chunks[i] = uint64(i) * 0xbf58476d1ce4e5b9
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = w.record(r)
	}
}
