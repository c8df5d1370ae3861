package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
)

// TestReqLog: a request's log lines carry its attributes, whether written
// directly or through a logger derived with With, and none are written
// below the base handler's level.
func TestReqLog(t *testing.T) {
	var buf bytes.Buffer
	base := slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})
	log, rh := newReqLog(base, "rid-1", "team-a")
	log.Debug("hidden")
	if buf.Len() != 0 {
		t.Fatalf("debug written at info: %s", buf.String())
	}
	read := func() map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", buf.String(), err)
		}
		buf.Reset()
		return m
	}
	log.Info("refused", "err", "x")
	if m := read(); m["request_id"] != "rid-1" || m["key"] != "team-a" || m["err"] != "x" || m["model"] != nil {
		t.Fatalf("line %v", m)
	}
	tl := rh.withTarget("demo", "sql")
	tl.Warn("cut")
	if m := read(); m["request_id"] != "rid-1" || m["model"] != "demo" || m["adapter"] != "sql" {
		t.Fatalf("line %v", m)
	}
	tl.With("replica", "demo-0").Info("waited")
	if m := read(); m["request_id"] != "rid-1" || m["model"] != "demo" || m["replica"] != "demo-0" {
		t.Fatalf("line %v", m)
	}
	_, anon := newReqLog(base, "rid-2", "")
	anon.withTarget("demo", "").Info("x")
	if m := read(); m["key"] != nil || m["adapter"] != nil || m["model"] != "demo" {
		t.Fatalf("line %v", m)
	}
}
