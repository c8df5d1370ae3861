package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lines reads a capture file: its header and its records.
func lines(t *testing.T, path string) (header, []record) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var h header
	var recs []record
	for i := 0; sc.Scan(); i++ {
		if i == 0 {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil || h.Capture != 1 {
				t.Fatalf("%s: header %q: %v", path, sc.Text(), err)
			}
			continue
		}
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s line %d: %v", path, i+1, err)
		}
		recs = append(recs, r)
	}
	return h, recs
}

func start(t *testing.T, cfg Config) (*Recorder, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := New(cfg, "r1", slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	return r, reg
}

// TestRecords: a record per request with its shape; shared prefixes
// share their hashes in the file, which are not the router's; the session
// is hashed; nothing of the file is the prompt's.
func TestRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	r, _ := start(t, Config{File: path, MaxBytes: DefaultMaxBytes, MaxFiles: 2})
	at := time.UnixMilli(1764547200123)
	r.Record(Request{Arrival: at, API: "chat", Model: "demo", Tenant: "acme", Session: "sess-secret-1",
		PromptBytes: 900, PromptTokens: 200, Prefix: []uint64{11, 22, 33}, Blocks: []uint64{7, 8}, BlockSize: 16,
		MaxTokens: 64, OutputTokens: 60, Stream: true, Status: 200})
	r.Record(Request{Arrival: at.Add(time.Second), API: "chat", Model: "demo", Session: "sess-secret-1",
		PromptBytes: 700, Prefix: []uint64{11, 22, 44}, OutputTokens: 5, Status: 200})
	r.Close()
	h, recs := lines(t, path)
	if h.Router != "r1" || h.KeyID == "" || h.ChunkBytes != 64 {
		t.Fatalf("header %+v", h)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	a, b := recs[0], recs[1]
	if a.T != 1764547200123 || a.API != "chat" || a.Model != "demo" || a.Tenant != "acme" || a.PromptBytes != 900 ||
		a.PromptTokens != 200 || a.MaxTokens != 64 || a.OutputTokens != 60 || !a.Stream || a.Status != 200 || a.BlockSize != 16 {
		t.Fatalf("record %+v", a)
	}
	if len(a.Prefix) != 3 || len(a.Blocks) != 2 || len(b.Blocks) != 0 || b.BlockSize != 0 {
		t.Fatalf("hash counts: %d prefix, %d blocks; then %d blocks", len(a.Prefix), len(a.Blocks), len(b.Blocks))
	}
	// Sharing is kept, values are not the router's.
	if a.Prefix[0] != b.Prefix[0] || a.Prefix[1] != b.Prefix[1] || a.Prefix[2] == b.Prefix[2] {
		t.Fatalf("prefix sharing lost: %v vs %v", a.Prefix, b.Prefix)
	}
	if slices.Contains(a.Prefix, "b") || slices.Contains(a.Prefix, "11") { // 11 in hex, and as written
		t.Fatalf("prefix hashes written as the router's: %v", a.Prefix)
	}
	if a.Session == "" || a.Session != b.Session || strings.Contains(a.Session, "secret") {
		t.Fatalf("sessions %q, %q: want one keyed hash", a.Session, b.Session)
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), "sess-secret") {
		t.Fatal("the session key is in the file")
	}
}

// TestKeysDiffer: two captures of the same traffic write different
// hashes (each its own key), so a capture's hashes cannot be matched
// against another's or a guess.
func TestKeysDiffer(t *testing.T) {
	dir := t.TempDir()
	var got []string
	for i := range 2 {
		path := filepath.Join(dir, "c"+string(rune('0'+i)))
		r, _ := start(t, Config{File: path, MaxBytes: DefaultMaxBytes, MaxFiles: 1})
		r.Record(Request{Arrival: time.Now(), API: "chat", Model: "m", Prefix: []uint64{42}, Status: 200})
		r.Close()
		_, recs := lines(t, path)
		got = append(got, recs[0].Prefix[0])
	}
	if got[0] == got[1] {
		t.Fatalf("both captures wrote %s for the same hash", got[0])
	}
}

// TestRotation: past MaxBytes the file is rotated; at most MaxFiles
// rotated files are kept, each starting with its header.
func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	r, reg := start(t, Config{File: path, MaxBytes: minBytes, MaxFiles: 2})
	prefix := make([]uint64, 40) // ~700 bytes a record: 5 a file
	for i := range 40 {
		r.Record(Request{Arrival: time.Now(), API: "chat", Model: "m", Prefix: prefix, Status: 200, OutputTokens: i})
		// The queue holds all 40: nothing is dropped.
	}
	r.Close()
	if n := testkit.Metric(t, reg, "llmgw_router_capture_records_total", nil); n != 40 {
		t.Fatalf("%v records written, want 40", n)
	}
	if testkit.Metric(t, reg, "llmgw_router_capture_rotations_total", nil) < 3 {
		t.Fatal("fewer than 3 rotations for 40 records of ~700 bytes in 4 KiB files")
	}
	for _, p := range []string{path, path + ".1", path + ".2"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > minBytes {
			t.Errorf("%s: %d bytes, past the bound %d", p, st.Size(), minBytes)
		}
		lines(t, p) // a header first, then records
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("%s.3 kept: want at most 2 rotated files (err %v)", path, err)
	}
	// The newest records are in the current file.
	_, recs := lines(t, path)
	if len(recs) == 0 || recs[len(recs)-1].OutputTokens != 39 {
		t.Fatalf("the current file ends with %+v; want the last record", recs)
	}
}

// TestFullQueueDrops: a writer that cannot keep up costs records, never a
// request's wait.
func TestFullQueueDrops(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(Config{File: filepath.Join(t.TempDir(), "c"), MaxBytes: DefaultMaxBytes, MaxFiles: 1}, "r1", slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	for range QueueSize + 10 { // Run not started: nothing drains
		r.Record(Request{API: "chat"})
	}
	if n := testkit.Metric(t, reg, "llmgw_router_capture_dropped_total", nil); n != 10 {
		t.Fatalf("%v dropped, want 10", n)
	}
	var nilRec *Recorder
	nilRec.Record(Request{}) // off: a no-op
	nilRec.Close()
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{DefaultConfig(), ""},
		{Config{MaxBytes: 100, MaxFiles: 1}, "capture-max-bytes"},
		{Config{MaxBytes: DefaultMaxBytes}, "capture-max-files"},
	} {
		ps := tt.cfg.Validate()
		got := ""
		if len(ps) > 0 {
			got = ps[0].Flag
		}
		if got != tt.want {
			t.Errorf("Validate(%+v) named %q, want %q", tt.cfg, got, tt.want)
		}
	}
}
