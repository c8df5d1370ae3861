// Package capture records a privacy-preserving trace of the router's
// traffic to a file (design §9.2, issue 33): per request its arrival, API,
// model, tenant, a hash of its session key, the prompt's length in bytes
// and tokens, its prefix hashes, the answer's length and status — no text
// and nothing that reads back to text. It is what a replay needs to
// rebuild the traffic's shape: when requests came, how long they were, and
// which of them shared which prefixes.
//
// Privacy. The router's prefix hashes are FNV-1a chains of 64-byte chunks
// and tier 2's are vLLM's block hashes: both are computed the same in
// every process, so anyone holding a guess at a prompt (a known system
// prompt) could check it against them. Each capture therefore draws a
// random 128-bit key when it starts and writes every hash through AES
// under that key (a keyed permutation): two requests that shared a
// prefix still share its hashes in the file, and nothing else can be
// learnt from them; the key is never written. Session keys are written as
// HMAC-SHA-256 under the same key, truncated to 64 bits.
//
// Bounds. Records go through a queue of QueueSize to one writer
// goroutine, so a request never waits on the disk; a full queue drops the
// record (counted). The file is rotated when it would pass MaxBytes: FILE
// becomes FILE.1, FILE.1 FILE.2, and so on up to MaxFiles, the oldest
// removed; so the capture holds at most (MaxFiles+1) × MaxBytes.
package capture

import (
	"bufio"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a capture. Its keys are the router's flags with
// underscores.
type Config struct {
	// File is where records are written, JSON lines; "" turns capture off.
	File string `yaml:"capture_file"`
	// MaxBytes is a file's size before it is rotated.
	MaxBytes int64 `yaml:"capture_max_bytes"`
	// MaxFiles is how many rotated files are kept beside File.
	MaxFiles int `yaml:"capture_max_files"`
}

// Defaults: 64 MiB a file, four kept: 320 MiB at most, about 1.5 million
// requests of a chat workload's ~200-byte records.
const (
	DefaultMaxBytes = 64 << 20
	DefaultMaxFiles = 4
	// QueueSize bounds the records waiting for the writer.
	QueueSize = 4096
	minBytes  = 4 << 10
)

// DefaultConfig is capture off, with the default bounds.
func DefaultConfig() Config { return Config{MaxBytes: DefaultMaxBytes, MaxFiles: DefaultMaxFiles} }

// Problem is one bad field: Flag is its flag's name.
type Problem struct {
	Flag string
	Err  error
}

// Validate returns the config's problems.
func (c Config) Validate() []Problem {
	var ps []Problem
	if c.MaxBytes < minBytes {
		ps = append(ps, Problem{"capture-max-bytes", fmt.Errorf("must be at least %d, got %d", minBytes, c.MaxBytes)})
	}
	if c.MaxFiles < 1 {
		ps = append(ps, Problem{"capture-max-files", fmt.Errorf("must be at least 1, got %d", c.MaxFiles)})
	}
	return ps
}

// Request is what the router knows of one request once it ended.
type Request struct {
	Arrival time.Time
	// API is the endpoint's API (chat, completions, responses, messages,
	// ...); Model the base model it was for; Tenant its tenant ("" without
	// a key).
	API, Model, Tenant string
	// Session is the request's session key ("" without one); written
	// hashed.
	Session string
	// PromptBytes is the request body's length; PromptTokens the prompt's
	// tokens when tier 2 tokenized it (0 otherwise).
	PromptBytes, PromptTokens int
	// Prefix are tier 1's chained hashes of the prompt's 64-byte chunks;
	// Blocks tier 2's block hashes (vLLM's, BlockSize tokens each) when it
	// tokenized. Written keyed; read only by the writer, after Record.
	Prefix, Blocks []uint64
	BlockSize      int
	// MaxTokens is the output the request allowed (0: unset);
	// OutputTokens what the answer reported.
	MaxTokens, OutputTokens int
	Stream                  bool
	Status                  int
}

// record is one line of the file.
type record struct {
	T            int64    `json:"t_ms"` // arrival, Unix milliseconds
	API          string   `json:"api"`
	Model        string   `json:"model"`
	Tenant       string   `json:"tenant,omitempty"`
	Session      string   `json:"session,omitempty"`
	PromptBytes  int      `json:"prompt_bytes"`
	PromptTokens int      `json:"prompt_tokens,omitempty"`
	Prefix       []string `json:"prefix,omitempty"`
	Blocks       []string `json:"blocks,omitempty"`
	BlockSize    int      `json:"block_size,omitempty"`
	MaxTokens    int      `json:"max_tokens,omitempty"`
	OutputTokens int      `json:"output_tokens"`
	Stream       bool     `json:"stream,omitempty"`
	Status       int      `json:"status"`
}

// header is each file's first line: what the records mean.
type header struct {
	Capture    int    `json:"llmgw_capture"` // the format's version
	Started    string `json:"started"`
	Router     string `json:"router"`
	ChunkBytes int    `json:"prefix_chunk_bytes"`
	// KeyID names the capture's key (a hash of it) so two files of one
	// capture are known to share their hashes' key.
	KeyID string `json:"key_id"`
}

// Recorder writes a capture. Record is safe for concurrent use; Run
// writes until Close.
type Recorder struct {
	cfg    Config
	router string
	log    *slog.Logger
	q      chan Request
	block  cipher.Block
	key    [16]byte
	keyID  string
	m      *metrics
	start  time.Time
	stop   chan struct{}
	once   sync.Once
	closed chan struct{}

	f    *os.File
	w    *bufio.Writer
	size int64
}

// New builds a recorder for router (its id, written in each file's
// header); nil when cfg has no file. Nothing is opened until Run.
func New(cfg Config, router string, log *slog.Logger, reg prometheus.Registerer) (*Recorder, error) {
	if cfg.File == "" {
		return nil, nil
	}
	if ps := cfg.Validate(); len(ps) > 0 {
		return nil, fmt.Errorf("capture: --%s: %w", ps[0].Flag, ps[0].Err)
	}
	r := &Recorder{cfg: cfg, router: router, log: log, q: make(chan Request, QueueSize), m: newMetrics(reg),
		stop: make(chan struct{}), closed: make(chan struct{})}
	if _, err := rand.Read(r.key[:]); err != nil {
		return nil, fmt.Errorf("capture: key: %w", err)
	}
	b, err := aes.NewCipher(r.key[:])
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	r.block = b
	id := sha256.Sum256(append([]byte("llmgw capture key id\x00"), r.key[:]...))
	r.keyID = fmt.Sprintf("%x", id[:8])
	return r, nil
}

// Record queues a request's record; a full queue drops it. A nil
// Recorder records nothing.
func (r *Recorder) Record(req Request) {
	if r == nil {
		return
	}
	select {
	case r.q <- req:
	default:
		r.m.dropped.Inc()
	}
}

// Run opens the file and writes records until Close (or ctx's end),
// then flushes and closes it. It returns the error that stopped the
// capture, if any; requests go on either way.
func (r *Recorder) Run(ctx context.Context) error {
	defer close(r.closed)
	r.start = time.Now()
	if err := r.open(); err != nil {
		r.log.Error("router: capture stopped", "file", r.cfg.File, "err", err)
		r.drain(ctx)
		return err
	}
	flush := time.NewTicker(time.Second)
	defer flush.Stop()
	var err error
	for err == nil {
		select {
		case req := <-r.q:
			err = r.write(req)
		case <-flush.C:
			err = r.w.Flush()
		case <-ctx.Done():
			return r.finish(nil)
		case <-r.stop:
			// What was queued before Close is written.
			for {
				select {
				case req := <-r.q:
					if err = r.write(req); err != nil {
						return r.finish(err)
					}
				default:
					return r.finish(nil)
				}
			}
		}
	}
	r.log.Error("router: capture stopped", "file", r.cfg.File, "err", err)
	_ = r.finish(err)
	r.drain(ctx)
	return err
}

// drain drops records until Close, so Record never blocks and the queue
// does not hold requests' hashes after the capture failed.
func (r *Recorder) drain(ctx context.Context) {
	for {
		select {
		case <-r.q:
			r.m.dropped.Inc()
		case <-r.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Close stops Run after it wrote what was queued, and waits for it; Run
// must have been started. Safe to call more than once, and on nil.
func (r *Recorder) Close() {
	if r == nil {
		return
	}
	r.once.Do(func() { close(r.stop) })
	<-r.closed
}

func (r *Recorder) finish(err error) error {
	if r.w != nil {
		if ferr := r.w.Flush(); err == nil {
			err = ferr
		}
	}
	if r.f != nil {
		if cerr := r.f.Close(); err == nil {
			err = cerr
		}
		r.f = nil
	}
	return err
}

// open starts a new file at cfg.File (appending to none: a file left by
// an earlier capture is rotated away first, its key being another).
func (r *Recorder) open() error {
	if _, err := os.Stat(r.cfg.File); err == nil {
		if err := r.shift(); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(r.cfg.File, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	r.f, r.w, r.size = f, bufio.NewWriterSize(f, 64<<10), 0
	b, _ := json.Marshal(header{Capture: 1, Started: r.start.UTC().Format(time.RFC3339Nano), Router: r.router,
		ChunkBytes: 64, KeyID: r.keyID})
	return r.line(b)
}

// shift rotates FILE to FILE.1 and each FILE.n to FILE.n+1, the one past
// MaxFiles removed.
func (r *Recorder) shift() error {
	name := func(n int) string {
		if n == 0 {
			return r.cfg.File
		}
		return r.cfg.File + "." + strconv.Itoa(n)
	}
	if err := os.Remove(name(r.cfg.MaxFiles)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("capture: rotate: %w", err)
	}
	for n := r.cfg.MaxFiles - 1; n >= 0; n-- {
		if err := os.Rename(name(n), name(n+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("capture: rotate: %w", err)
		}
	}
	return nil
}

// write writes req's record, rotating first when it would pass MaxBytes.
func (r *Recorder) write(req Request) error {
	rec := record{T: req.Arrival.UnixMilli(), API: req.API, Model: req.Model, Tenant: req.Tenant,
		PromptBytes: req.PromptBytes, PromptTokens: req.PromptTokens, BlockSize: req.BlockSize,
		MaxTokens: req.MaxTokens, OutputTokens: req.OutputTokens, Stream: req.Stream, Status: req.Status}
	if req.Session != "" {
		rec.Session = r.sessionHash(req.Session)
	}
	rec.Prefix = r.hashes(req.Prefix)
	if len(req.Blocks) > 0 {
		rec.Blocks = r.hashes(req.Blocks)
	} else {
		rec.BlockSize = 0
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if r.size+int64(len(b))+1 > r.cfg.MaxBytes && r.size > 0 {
		if err := r.finish(nil); err != nil {
			return err
		}
		if err := r.open(); err != nil {
			return err
		}
		r.m.rotations.Inc()
	}
	if err := r.line(b); err != nil {
		return err
	}
	r.m.records.Inc()
	return nil
}

func (r *Recorder) line(b []byte) error {
	if _, err := r.w.Write(b); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if err := r.w.WriteByte('\n'); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	r.size += int64(len(b)) + 1
	return nil
}

// hashes are hs each through the capture's keyed permutation, in hex.
func (r *Recorder) hashes(hs []uint64) []string {
	if len(hs) == 0 {
		return nil
	}
	out := make([]string, len(hs))
	var in, enc [aes.BlockSize]byte
	for i, h := range hs {
		binary.BigEndian.PutUint64(in[8:], h)
		r.block.Encrypt(enc[:], in[:])
		out[i] = strconv.FormatUint(binary.BigEndian.Uint64(enc[:8]), 16)
	}
	return out
}

// sessionHash is a session key under the capture's key.
func (r *Recorder) sessionHash(s string) string {
	m := hmac.New(sha256.New, r.key[:])
	m.Write([]byte(s))
	return fmt.Sprintf("%x", m.Sum(nil)[:8])
}

type metrics struct {
	records, dropped, rotations prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_router_capture_records_total",
			Help: "Requests written to the traffic capture (--capture-file)."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_router_capture_dropped_total",
			Help: "Requests not written to the traffic capture: its queue was full, or the capture had stopped on an error."}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_router_capture_rotations_total",
			Help: "Times the traffic capture's file reached --capture-max-bytes and was rotated."}),
	}
	if reg != nil {
		reg.MustRegister(m.records, m.dropped, m.rotations)
	}
	return m
}
