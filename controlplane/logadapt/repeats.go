package logadapt

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Repeated warnings and errors of the libraries are rate-limited (issue
// 26): most are about a peer's junk — raft's "failed to decode incoming
// command" for each silent socket it times out, memberlist's "Decrypt
// packet failed" for each forged UDP packet, a refused gossip stream —
// one line per connection or packet, which a flood turned into 114 k lines
// in 40 s. Each kind of line (its message up to the first ": ", digits
// folded, so every address is one kind) may log repeatBurst lines per
// repeatWindow; the rest are counted, and the next line of the kind to pass
// carries the count (suppressed_repeats). Info and debug lines — state
// changes, not junk — are never limited.
const (
	repeatBurst  = 5
	repeatWindow = 10 * time.Second
	// repeatKinds bounds the kinds remembered; past it new kinds share one
	// more count, so junk cannot grow the table.
	repeatKinds = 256
)

// repeats is the rate limit of one adapter. Its zero value is ready.
type repeats struct {
	mu    sync.Mutex
	kinds map[string]*repeatWindowState
}

type repeatWindowState struct {
	start      time.Time
	n          int
	suppressed int
}

// log logs msg at level through l with attrs, unless the rate limit holds
// it back; a line that passes after others of its kind were held back
// carries their count.
func (r *repeats) log(l *slog.Logger, now func() time.Time, level slog.Level, msg string, attrs ...any) {
	ok, suppressed := r.allow(level, msg, clock(now))
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_repeats", suppressed)
	}
	l.Log(context.Background(), level, msg, attrs...) //nolint:sloglint // a library's message, passed on as it wrote it
}

// allow says whether a line of msg at level, at now, is logged, and how
// many of its kind were suppressed since the last one logged.
func (r *repeats) allow(level slog.Level, msg string, now time.Time) (ok bool, suppressed int) {
	if level < slog.LevelWarn {
		return true, 0
	}
	key := repeatKind(msg)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kinds == nil {
		r.kinds = map[string]*repeatWindowState{}
	}
	w := r.kinds[key]
	if w == nil {
		if len(r.kinds) >= repeatKinds {
			for k, v := range r.kinds {
				if now.Sub(v.start) >= repeatWindow && v.suppressed == 0 {
					delete(r.kinds, k)
				}
			}
		}
		if len(r.kinds) >= repeatKinds {
			key = ""
			w = r.kinds[key]
		}
		if w == nil {
			w = &repeatWindowState{start: now}
			r.kinds[key] = w
		}
	}
	if now.Sub(w.start) >= repeatWindow {
		suppressed = w.suppressed
		*w = repeatWindowState{start: now, n: 1}
		return true, suppressed
	}
	if w.n < repeatBurst {
		w.n++
		return true, 0
	}
	w.suppressed++
	return false, 0
}

// repeatKind is what makes two lines the same kind: the message up to its
// first ": " (what follows is usually the error and the peer), at most 80
// bytes, with every run of digits folded to '#'.
func repeatKind(msg string) string {
	if i := strings.Index(msg, ": "); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	var b strings.Builder
	digits := false
	for _, c := range msg {
		if c >= '0' && c <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(c)
	}
	return b.String()
}
