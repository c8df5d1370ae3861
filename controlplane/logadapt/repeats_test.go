package logadapt

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRepeatKind(t *testing.T) {
	tests := []struct{ a, b string }{
		{"Decrypt packet failed: No installed keys could decrypt the message from=127.0.0.2:4000",
			"Decrypt packet failed: message authentication failed from=10.1.2.3:7946"},
		{"refusing a gossip stream from 127.0.0.2:5555: read tcp: i/o timeout",
			"refusing a gossip stream from 127.0.0.41:61000: EOF"},
		{"msg type (3) not supported from=127.0.0.2:1", "msg type (12) not supported from=127.0.0.3:2"},
	}
	for _, tt := range tests {
		if ka, kb := repeatKind(tt.a), repeatKind(tt.b); ka != kb {
			t.Errorf("kinds differ: %q (%q) and %q (%q)", ka, tt.a, kb, tt.b)
		}
	}
	if repeatKind("failed to decode incoming command") == repeatKind("failed to flush response") {
		t.Error("two messages are one kind")
	}
}

func TestRepeatsAllow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type line struct {
		at    time.Duration
		level slog.Level
		msg   string
		// want: logged; suppressed: the count it carries.
		want       bool
		suppressed int
	}
	junk := func(at time.Duration, want bool, suppressed int) line {
		return line{at, slog.LevelError, "Decrypt packet failed: x from=127.0.0.2:1", want, suppressed}
	}
	tests := []struct {
		name  string
		lines []line
	}{
		{"a burst, then nothing, then the count", []line{
			junk(0, true, 0), junk(1, true, 0), junk(2, true, 0), junk(3, true, 0), junk(4, true, 0),
			junk(5, false, 0), junk(6, false, 0),
			junk(repeatWindow, true, 2), junk(repeatWindow+1, true, 0)}},
		{"info is never limited", func() []line {
			var ls []line
			for i := range 20 {
				ls = append(ls, line{time.Duration(i), slog.LevelInfo, "entering follower state", true, 0})
			}
			return ls
		}()},
		{"kinds are counted apart", []line{
			junk(0, true, 0), junk(0, true, 0), junk(0, true, 0), junk(0, true, 0), junk(0, true, 0), junk(0, false, 0),
			{0, slog.LevelWarn, "failed to decode incoming command", true, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r repeats
			for i, l := range tt.lines {
				ok, n := r.allow(l.level, l.msg, t0.Add(l.at))
				if ok != l.want || n != l.suppressed {
					t.Fatalf("line %d (%q at +%v): allow = %v, %d; want %v, %d", i, l.msg, l.at, ok, n, l.want, l.suppressed)
				}
			}
		})
	}
}

// TestRepeatsBounded: junk of ever new kinds does not grow the table past
// repeatKinds, and is still limited.
func TestRepeatsBounded(t *testing.T) {
	var r repeats
	logged := 0
	for i := range 10 * repeatKinds {
		if ok, _ := r.allow(slog.LevelError, fmt.Sprintf("junk kind %c%c", 'a'+i%26, 'a'+(i/26)%26), time.Unix(0, 0)); ok {
			logged++
		}
	}
	if len(r.kinds) > repeatKinds+1 {
		t.Errorf("%d kinds remembered, bound %d and the shared one", len(r.kinds), repeatKinds)
	}
	if logged > (repeatKinds+1)*repeatBurst {
		t.Errorf("%d of %d lines logged", logged, 10*repeatKinds)
	}
}

// TestWritersLimitJunk: a flood of one junk line through either adapter
// logs repeatBurst lines per window.
func TestWritersLimitJunk(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ml := &LineWriter{Log: log, Parse: MemberlistLine, Now: clock}
	hc := &HCLogWriter{Log: log, Now: clock}
	for i := range 1000 {
		fmt.Fprintf(ml, "[ERR] memberlist: Decrypt packet failed: no key from=127.0.0.%d:%d\n", 2+i%40, 4000+i)
		fmt.Fprintf(hc, `{"@level":"error","@message":"failed to decode incoming command","error":"read tcp 127.0.0.1:1->127.0.0.2:%d: i/o timeout"}`+"\n", i)
	}
	if n := strings.Count(buf.String(), "\n"); n != 2*repeatBurst {
		t.Fatalf("%d lines logged for 2000, want %d:\n%s", n, 2*repeatBurst, buf.String())
	}
	buf.Reset()
	he := &LineWriter{Log: log, Parse: HTTPErrorLine, Now: clock}
	for i := range 100 {
		fmt.Fprintf(he, "http: TLS handshake error from 127.0.0.%d:%d: EOF\n", 2+i%40, 4000+i)
	}
	fmt.Fprintf(he, "http: panic serving 127.0.0.1:1: boom\n")
	if n := strings.Count(buf.String(), "\n"); n != repeatBurst+1 {
		t.Fatalf("%d net/http lines logged for 101 (100 of one kind), want %d:\n%s", n, repeatBurst+1, buf.String())
	}
	if !strings.Contains(buf.String(), `msg="TLS handshake error from 127.0.0.2:4000: EOF"`) {
		t.Fatalf("net/http's line is not passed on as written: %s", buf.String())
	}
	now = now.Add(repeatWindow)
	buf.Reset()
	fmt.Fprintf(ml, "[ERR] memberlist: Decrypt packet failed: no key from=127.0.0.2:1\n")
	if !strings.Contains(buf.String(), "suppressed_repeats=995") {
		t.Fatalf("the next line does not carry the count: %s", buf.String())
	}
}
