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
	return log.New(&LineWriter{Log: l, Parse: MemberlistLine}, "", 0)
}

// NewHTTPErrorLog returns an http.Server's ErrorLog writing through l
// (HTTPErrorLine): net/http logs a line per failed TLS handshake, which
// junk connections make one per socket.
func NewHTTPErrorLog(l *slog.Logger) *log.Logger {
	return log.New(&LineWriter{Log: l, Parse: HTTPErrorLine}, "", 0)
}

// LineWriter re-logs a library's text lines through slog, each at the
// level and with the message Parse reads from it. Repeated warnings and
// errors are rate-limited (repeats.go).
type LineWriter struct {
	Log   *slog.Logger
	Parse func(line []byte) (slog.Level, string)
	// Now is the rate limit's clock; time.Now when nil.
	Now     func() time.Time
	repeats repeats
}

func (w *LineWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		if line = bytes.TrimSpace(line); len(line) > 0 {
			level, msg := w.Parse(line)
			w.repeats.log(w.Log, w.Now, level, msg)
		}
	}
	return len(p), nil
}

// MemberlistLine reads memberlist's "[LEVEL] memberlist: msg"; a line
// without a level is info.
func MemberlistLine(line []byte) (slog.Level, string) {
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError, "[ERROR]": slog.LevelError} {
		if bytes.HasPrefix(line, []byte(prefix)) {
			level = l
			line = bytes.TrimSpace(line[len(prefix):])
			break
		}
	}
	return level, string(bytes.TrimPrefix(line, []byte("memberlist: ")))
}

// HTTPErrorLine reads net/http's server errors, all warnings, without the
// "http: " that opens every one (and would make every line one kind).
func HTTPErrorLine(line []byte) (slog.Level, string) {
	return slog.LevelWarn, string(bytes.TrimPrefix(line, []byte("http: ")))
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
	_ io.Writer = (*LineWriter)(nil)
)
