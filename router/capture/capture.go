// Package capture records a trace of a router's traffic that a replay can
// reproduce and that holds no text (design §9 "Capture and replay", issue
// 33): per request its arrival, model, tenant, API, a salted hash of its
// session, its prompt's length and the salted hashes of its prompt's
// blocks, its output's length, its status and its time to first token.
//
// Why block hashes: a routing policy is judged by what it makes of the
// prefixes requests share, and chained block hashes (each covers its block
// and everything before it, as vLLM's and tier 1's do) are exactly that
// structure without the words. Why salted: an engine's block hash is a
// function of the tokens, so anyone holding a list of candidate prompts
// (a public system prompt, a leaked document) could test a raw capture
// for them. Each hash is replaced by a keyed hash under a salt drawn at
// random when the Writer starts and never written, so sharing within a
// capture survives and the link to text does not — nor to another
// capture, or to the router's own /debug/kvindex.
//
// Recording must not slow the request path: a request's record is handed
// to the writer's goroutine through a bounded queue, and dropped (and
// counted) when the queue is full; salting and encoding happen there.
// Files are bounded and rotated, as a log is.
package capture

import (
	"bufio"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
)

// Config is the capture's part of the router's config, inlined there.
type Config struct {
	// Path is the file records are appended to; rotated files are
	// Path.1 (the newest) to Path.MaxFiles. Empty: no capture.
	Path string `yaml:"capture_path"`
	// MaxBytes bounds one file: past it, the file is rotated.
	MaxBytes int64 `yaml:"capture_max_bytes"`
	// MaxFiles is how many rotated files are kept beside the current one.
	MaxFiles int `yaml:"capture_max_files"`
	// Queue is how many records may wait for the writer; past it a
	// record is dropped (llmgw_router_capture_records_total{result="dropped"}).
	Queue int `yaml:"capture_queue"`
}

// Defaults: 256 MiB a file, 4 rotated (1.25 GiB in all: an hour of 300
// requests a second with 4,000-token prompts), a queue of 4,096 records.
const (
	DefaultMaxBytes = 256 << 20
	DefaultMaxFiles = 4
	DefaultQueue    = 4096
)

// WithDefaults fills the zero values of an enabled capture.
func (c Config) WithDefaults() Config {
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxFiles == 0 {
		c.MaxFiles = DefaultMaxFiles
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	return c
}

// Validate adds the config's problems to p, naming the keys.
func (c Config) Validate(p *configfile.Problems) {
	if c.Path == "" {
		return
	}
	if c.MaxBytes < 1<<20 {
		p.Add("capture_max_bytes", "must be at least 1 MiB (1048576), got %d", c.MaxBytes)
	}
	if c.MaxFiles < 0 || c.MaxFiles > 100 {
		p.Add("capture_max_files", "must be within [0, 100], got %d", c.MaxFiles)
	}
	if c.Queue < 1 || c.Queue > 1<<20 {
		p.Add("capture_queue", "must be within [1, 1048576], got %d", c.Queue)
	}
	if dir := filepath.Dir(c.Path); dir != "" {
		if st, err := os.Stat(dir); err != nil {
			p.Add(configfile.Flag("capture-path"), "%q: its directory: %w", c.Path, err)
		} else if !st.IsDir() {
			p.Add(configfile.Flag("capture-path"), "%q: %s is not a directory", c.Path, dir)
		}
	}
}

// Version is the format's version, in every file's header line.
const Version = 1

// Header is a file's first line.
type Header struct {
	Capture int `json:"llmgw_capture"`
	// Started is when the Writer started: every record's T counts from it,
	// in every file of the capture.
	Started time.Time `json:"started"`
	// Salt identifies the capture's salt (its own hash, not the salt):
	// records of files with the same Salt may be compared.
	Salt string `json:"salt"`
}

// Units of Record.Blocks.
const (
	// UnitTokens: tier 2's block hashes, BlockSize tokens each.
	UnitTokens = "tokens"
	// UnitBytes: tier 1's chunk hashes of the prompt's leading text,
	// BlockSize bytes each (at most tier 1's chunk limit of them).
	UnitBytes = "bytes"
)

// Record is one request, a line of the file.
type Record struct {
	// T is the request's arrival, seconds since Header.Started.
	T       float64 `json:"t"`
	Model   string  `json:"model"`
	Tenant  string  `json:"tenant,omitempty"`
	API     string  `json:"api"`
	Stream  bool    `json:"stream,omitempty"`
	Session string  `json:"session,omitempty"`
	// PromptTokens is the prompt's length: the engine's count when it
	// answered with usage, else tier 2's, else 0.
	PromptTokens int `json:"prompt_tokens"`
	// PromptBytes is the request body's size.
	PromptBytes int `json:"prompt_bytes"`
	// Blocks are the prompt's chained block hashes, salted, hex; Unit and
	// BlockSize say what one covers.
	Unit      string   `json:"unit,omitempty"`
	BlockSize int      `json:"block_size,omitempty"`
	Blocks    []string `json:"blocks,omitempty"`
	// Chunks are tier 1's chained chunk hashes of the prompt's leading
	// text, ChunkSize bytes each, salted, hex: recorded beside tier 2's
	// Blocks (Unit tokens) only. A request tier 2 could not read (its
	// tokenize timed out) has tier 1's chunks alone; a replay finds
	// another request whose Chunks share its leading chunks and gives it
	// the tier-2 blocks that shared text is (bench.LoadCapture) — without
	// them it would replay as a prompt sharing nothing with the requests
	// whose prefix it in fact shared.
	ChunkSize int      `json:"chunk_size,omitempty"`
	Chunks    []string `json:"chunks,omitempty"`
	// OutputTokens and CachedTokens are the engine's usage (0 unknown).
	OutputTokens int `json:"output_tokens"`
	CachedTokens int `json:"cached_tokens,omitempty"`
	// MaxTokens is the request's own bound, recorded for an answer
	// without usage (a failure): a replay asks for it instead.
	MaxTokens int     `json:"max_tokens,omitempty"`
	Status    int     `json:"status"`
	TTFTMs    float64 `json:"ttft_ms,omitempty"`
	Replica   string  `json:"replica,omitempty"`
}

// Request is what the router hands the writer: raw hashes and the session
// as sent, salted by the writer off the request path.
type Request struct {
	Arrived      time.Time
	Model        string
	Tenant       string
	API          string
	Stream       bool
	Session      string
	PromptTokens int
	PromptBytes  int
	Unit         string
	BlockSize    int
	// Hashes are owned by the writer once handed over (the caller copies).
	Hashes []uint64
	// Chunks are tier 1's, beside tier 2's Hashes (Unit tokens), ChunkSize
	// bytes each; owned by the writer as Hashes are.
	Chunks       []uint64
	ChunkSize    int
	OutputTokens int
	CachedTokens int
	MaxTokens    int
	Status       int
	TTFT         time.Duration
	Replica      string
}

// Metrics are the writer's counters; nil ones are not counted.
type Metrics struct {
	Written, Dropped, Rotations, Errors func()
}

// Writer records requests to the capture's files. Record is safe for
// concurrent use; Run owns the file.
type Writer struct {
	cfg     Config
	log     *slog.Logger
	m       Metrics
	now     func() time.Time
	salt    [32]byte
	block   cipher.Block // AES-128 under salt[:16], for saltedHashes
	started time.Time
	queue   chan Request
	closed  atomic.Bool
}

// New returns a writer for cfg (its Path set); Run starts writing.
func New(cfg Config, log *slog.Logger, m Metrics, now func() time.Time) (*Writer, error) {
	cfg = cfg.WithDefaults()
	if now == nil {
		now = time.Now
	}
	w := &Writer{cfg: cfg, log: log, m: m, now: now, started: now(), queue: make(chan Request, cfg.Queue)}
	if _, err := rand.Read(w.salt[:]); err != nil {
		return nil, fmt.Errorf("capture: drawing the salt: %w", err)
	}
	block, err := aes.NewCipher(w.salt[:16])
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	w.block = block
	return w, nil
}

// Record queues r; it never blocks. A nil Writer records nothing.
func (w *Writer) Record(r Request) {
	if w == nil || w.closed.Load() {
		return
	}
	select {
	case w.queue <- r:
	default:
		count(w.m.Dropped)
	}
}

func count(f func()) {
	if f != nil {
		f()
	}
}

// Run writes queued records until ctx ends, then writes what is queued
// and closes the file.
func (w *Writer) Run(ctx context.Context) error {
	f, err := w.open()
	if err != nil {
		return err
	}
	defer func() {
		if f != nil {
			_ = f.close()
		}
	}()
	// The writer wakes on a tick, not on each record: a record is then a
	// send into a buffered channel nobody waits on, which readies no
	// goroutine on the request's processor ahead of the answer's flush
	// (waking the writer per record cost a request 5 µs of p50 on an
	// engine that answers at once). The queue holds DrainEvery's records:
	// at the default 4,096 and 50 ms, 80,000 requests a second.
	tick := time.NewTicker(DrainEvery)
	defer tick.Stop()
	write := func(r Request) {
		if f == nil {
			return
		}
		if err := f.write(w.record(r)); err != nil {
			count(w.m.Errors)
			w.log.Warn("capture: writing a record", "path", w.cfg.Path, "err", err)
			return
		}
		count(w.m.Written)
		if f.size >= w.cfg.MaxBytes {
			if f, err = w.rotate(f); err != nil {
				count(w.m.Errors)
				w.log.Error("capture: rotating; the capture stops", "path", w.cfg.Path, "err", err)
			}
		}
	}
	drain := func() {
		for {
			select {
			case r := <-w.queue:
				write(r)
			default:
				if f != nil {
					_ = f.w.Flush()
				}
				return
			}
		}
	}
	for {
		select {
		case <-tick.C:
			drain()
		case <-ctx.Done():
			w.closed.Store(true)
			drain()
			return nil
		}
	}
}

// DrainEvery is how often the writer takes what is queued.
const DrainEvery = 50 * time.Millisecond

// record salts and shapes r.
func (w *Writer) record(r Request) Record {
	out := Record{T: r.Arrived.Sub(w.started).Seconds(), Model: r.Model, Tenant: r.Tenant, API: r.API, Stream: r.Stream,
		PromptTokens: r.PromptTokens, PromptBytes: r.PromptBytes, OutputTokens: r.OutputTokens, CachedTokens: r.CachedTokens,
		MaxTokens: r.MaxTokens, Status: r.Status, Replica: r.Replica}
	if r.TTFT > 0 {
		out.TTFTMs = float64(r.TTFT.Microseconds()) / 1000
	}
	if r.Session != "" {
		out.Session = w.salted([]byte(r.Session))
	}
	if len(r.Hashes) > 0 {
		out.Unit, out.BlockSize = r.Unit, r.BlockSize
		out.Blocks = w.saltedHashes(r.Hashes)
		if len(r.Chunks) > 0 && r.Unit == UnitTokens {
			out.ChunkSize, out.Chunks = r.ChunkSize, w.saltedHashes(r.Chunks)
		}
	}
	return out
}

// saltedHashes is each hash under the salt, hex: the first 8 bytes of
// AES-128 (keyed by the salt's first half) of the hash, little-endian,
// padded with zeros — a keyed permutation of 64-bit values, so distinct
// hashes stay distinct and equal ones equal. AES rather than sha256
// because a record holds a hash per 16 tokens and per 64 bytes of text,
// ~170 for a 1,000-word prompt: hardware AES is one instruction sequence
// a hash, sha256 a compression and two allocations.
func (w *Writer) saltedHashes(hs []uint64) []string {
	const width = 16 // hex digits a hash
	hx := make([]byte, width*len(hs))
	var in, enc [aes.BlockSize]byte
	for i, h := range hs {
		binary.LittleEndian.PutUint64(in[:8], h)
		w.block.Encrypt(enc[:], in[:])
		hex.Encode(hx[i*width:], enc[:8])
	}
	// One string for all, each hash a slice of it: a string a hash was
	// most of the cost.
	all := string(hx)
	out := make([]string, len(hs))
	for i := range out {
		out[i] = all[i*width : (i+1)*width]
	}
	return out
}

// salted is the first 8 bytes of sha256(salt ‖ b), hex: a keyed hash (the
// input's length is fixed per use, so no length extension matters).
func (w *Writer) salted(b []byte) string {
	h := sha256.New()
	h.Write(w.salt[:])
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// file is the open capture file.
type file struct {
	f    *os.File
	w    *bufio.Writer
	size int64
	enc  *json.Encoder
}

func (f *file) write(r Record) error {
	return f.enc.Encode(r)
}

func (f *file) close() error {
	err := f.w.Flush()
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// counted counts the bytes written through it.
type counted struct{ f *file }

func (c counted) Write(p []byte) (int, error) {
	n, err := c.f.w.Write(p)
	c.f.size += int64(n)
	return n, err
}

// open starts a new file at Path (an existing one is rotated first, so a
// restarted router never mixes two salts in one file) and writes its
// header.
func (w *Writer) open() (*file, error) {
	if _, err := os.Stat(w.cfg.Path); err == nil {
		if err := w.shift(); err != nil {
			return nil, err
		}
	}
	fd, err := os.OpenFile(w.cfg.Path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	f := &file{f: fd, w: bufio.NewWriterSize(fd, 64<<10)}
	f.enc = json.NewEncoder(counted{f})
	id := sha256.Sum256(w.salt[:])
	if err := f.enc.Encode(Header{Capture: Version, Started: w.started.UTC(), Salt: hex.EncodeToString(id[:8])}); err != nil {
		_ = f.close()
		return nil, fmt.Errorf("capture: writing the header: %w", err)
	}
	return f, nil
}

// rotate closes f, shifts the files and opens a new one.
func (w *Writer) rotate(f *file) (*file, error) {
	if err := f.close(); err != nil {
		return nil, fmt.Errorf("capture: closing %s: %w", w.cfg.Path, err)
	}
	count(w.m.Rotations)
	return w.open()
}

// shift renames Path.i to Path.i+1 (the oldest past MaxFiles removed) and
// Path to Path.1.
func (w *Writer) shift() error {
	name := func(i int) string {
		if i == 0 {
			return w.cfg.Path
		}
		return fmt.Sprintf("%s.%d", w.cfg.Path, i)
	}
	if w.cfg.MaxFiles == 0 {
		if err := os.Remove(w.cfg.Path); err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		return nil
	}
	if err := os.Remove(name(w.cfg.MaxFiles)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("capture: %w", err)
	}
	for i := w.cfg.MaxFiles - 1; i >= 0; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("capture: %w", err)
		}
	}
	return nil
}
