package logadapt

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/hashicorp/go-hclog"
)

// NewHCLogger returns an hclog.Logger for raft or autopilot that writes
// through l: hclog writes one JSON object per entry, which is re-logged with
// its level and fields. Debug entries pass only when l has debug enabled.
func NewHCLogger(l *slog.Logger) hclog.Logger {
	level := hclog.Info
	if l.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      level,
		JSONFormat: true,
		Output:     &HCLogWriter{Log: l},
	})
}

// HCLogWriter is the io.Writer under NewHCLogger: each line, one hclog JSON
// entry, becomes one slog record. A line that is not JSON is logged as is,
// at info. Repeated warnings and errors are rate-limited (repeats.go).
type HCLogWriter struct {
	Log *slog.Logger
	// Now is the rate limit's clock; time.Now when nil.
	Now     func() time.Time
	repeats repeats
}

func (w *HCLogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var entry map[string]any
		if err := json.Unmarshal(line, &entry); err != nil {
			w.Log.Info(string(line)) //nolint:sloglint // another library's message, passed on as it wrote it
			continue
		}
		level := slog.LevelInfo
		switch entry["@level"] {
		case "trace", "debug":
			level = slog.LevelDebug
		case "warn":
			level = slog.LevelWarn
		case "error":
			level = slog.LevelError
		}
		msg, _ := entry["@message"].(string)
		attrs := make([]any, 0, 2*len(entry)+2)
		for k, v := range entry {
			if k == "@level" || k == "@message" || k == "@timestamp" || k == "@module" {
				continue
			}
			switch k {
			case "error":
				k = "err"
			case "node", "replica", "model", "request_id":
				// Our stable keys mean our objects; raft's "node" is a
				// Raft peer.
				k = "raft_" + k
			}
			attrs = append(attrs, k, v)
		}
		w.repeats.log(w.Log, w.Now, level, msg, attrs...)
	}
	return len(p), nil
}

// NewMemberlistLogger returns the *log.Logger memberlist's Config.Logger
// takes, writing through l.
func NewMemberlistLogger(l *slog.Logger) *log.Logger {
	return log.New(&MemberlistWriter{Log: l}, "", 0)
}

// MemberlistWriter re-logs memberlist's "[LEVEL] memberlist: msg" lines
// through slog at their level. Repeated warnings and errors are
// rate-limited (repeats.go).
type MemberlistWriter struct {
	Log *slog.Logger
	// Now is the rate limit's clock; time.Now when nil.
	Now     func() time.Time
	repeats repeats
}

func (w *MemberlistWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		level := slog.LevelInfo
		for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError, "[ERROR]": slog.LevelError} {
			if bytes.HasPrefix(line, []byte(prefix)) {
				level = l
				line = bytes.TrimSpace(line[len(prefix):])
				break
			}
		}
		w.repeats.log(w.Log, w.Now, level, string(bytes.TrimPrefix(line, []byte("memberlist: "))))
	}
	return len(p), nil
}

// NewHTTPErrorLog returns an http.Server's ErrorLog writing through l at
// warn, without net/http's "http: " prefix: net/http logs a line per failed TLS handshake ("http: TLS
// handshake error from ..."), which junk connections make one per socket;
// repeats are rate-limited as the libraries' are.
func NewHTTPErrorLog(l *slog.Logger) *log.Logger {
	return log.New(&HTTPErrorWriter{Log: l}, "", 0)
}

// HTTPErrorWriter is the io.Writer under NewHTTPErrorLog.
type HTTPErrorWriter struct {
	Log *slog.Logger
	// Now is the rate limit's clock; time.Now when nil.
	Now     func() time.Time
	repeats repeats
}

func (w *HTTPErrorWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		// net/http opens every line with "http: ", which would make every
		// line one kind.
		w.repeats.log(w.Log, w.Now, slog.LevelWarn, string(bytes.TrimPrefix(line, []byte("http: "))))
	}
	return len(p), nil
}

// clock is now, or time.Now when nil.
func clock(now func() time.Time) time.Time {
	if now == nil {
		return time.Now()
	}
	return now()
}

var (
	_ io.Writer = (*HCLogWriter)(nil)
	_ io.Writer = (*MemberlistWriter)(nil)
	_ io.Writer = (*HTTPErrorWriter)(nil)
)
