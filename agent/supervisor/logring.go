package supervisor

import (
	"bytes"
	"sync"
)

// logRing keeps an engine's last lines for `llmgwctl replica logs`: enough
// to see why it crashed, bounded so a chatty engine cannot grow the agent.
type logRing struct {
	mu      sync.Mutex
	lines   []string
	next    int
	full    bool
	partial []byte
}

const maxLineBytes = 4096

func newLogRing(n int) *logRing { return &logRing{lines: make([]string, n)} }

// write splits b into lines, keeps each complete one and returns them so the
// caller can log them too.
func (r *logRing) write(b []byte) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			r.partial = append(r.partial, b...)
			if len(r.partial) > maxLineBytes {
				done = append(done, r.add(r.partial))
				r.partial = r.partial[:0]
			}
			break
		}
		r.partial = append(r.partial, b[:i]...)
		done = append(done, r.add(r.partial))
		r.partial = r.partial[:0]
		b = b[i+1:]
	}
	return done
}

func (r *logRing) add(line []byte) string {
	if len(line) > maxLineBytes {
		line = line[:maxLineBytes]
	}
	s := string(bytes.TrimRight(line, "\r"))
	r.lines[r.next] = s
	r.next = (r.next + 1) % len(r.lines)
	if r.next == 0 {
		r.full = true
	}
	return s
}

// snapshot returns the kept lines, oldest first.
func (r *logRing) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]string(nil), r.lines[:r.next]...)
	}
	out := append([]string(nil), r.lines[r.next:]...)
	return append(out, r.lines[:r.next]...)
}
