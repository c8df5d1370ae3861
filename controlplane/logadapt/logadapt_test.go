package logadapt

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestHCLogWriter(t *testing.T) {
	tests := []struct {
		name string
		line string
		want []string
	}{
		{"json entry", `{"@level":"warn","@message":"heartbeat timeout","@module":"raft","error":"boom","node":"x"}` + "\n",
			[]string{"level=WARN", `msg="heartbeat timeout"`, "err=boom", "raft_node=x"}},
		{"debug", `{"@level":"debug","@message":"m"}`, []string{"level=DEBUG", "msg=m"}},
		{"not json", "plain text\n", []string{"level=INFO", `msg="plain text"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := &HCLogWriter{Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			if n, err := w.Write([]byte(tt.line)); err != nil || n != len(tt.line) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			for _, want := range tt.want {
				if !strings.Contains(buf.String(), want) {
					t.Fatalf("output %q lacks %q", buf.String(), want)
				}
			}
		})
	}
}

func TestMemberlistLogWriter(t *testing.T) {
	tests := []struct{ line, want string }{
		{"[WARN] memberlist: Was able to connect to c2\n", `level=WARN msg="Was able to connect to c2"`},
		{"[DEBUG] memberlist: Stream connection", `level=DEBUG msg="Stream connection"`},
		{"[ERR] memberlist: boom", `level=ERROR msg=boom`},
		{"no level", `level=INFO msg="no level"`},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			var buf bytes.Buffer
			w := &LineWriter{Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), Parse: MemberlistLine}
			if _, err := w.Write([]byte(tt.line)); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(buf.String(), tt.want) {
				t.Fatalf("got %q, want %q", buf.String(), tt.want)
			}
		})
	}
}
