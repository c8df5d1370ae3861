package datadir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// epochFile is the path of an epoch file holding content, none when
// content is empty.
func epochFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "epoch")
	if content != "" {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func TestNextEpoch(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		now     int64
		want    uint64
		wantErr bool
	}{
		{"no file takes the clock", "", 100, 100, false},
		{"clock behind the persisted epoch", "200\n", 100, 201, false},
		{"clock ahead", "50", 100, 100, false},
		{"corrupt file refused", "fifty", 100, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := epochFile(t, tt.file)
			got, err := NextEpoch(path, tt.now)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("NextEpoch = %d, %v; want %d (error %v)", got, err, tt.want, tt.wantErr)
			}
			if err != nil {
				return
			}
			again, err := NextEpoch(path, tt.now)
			if err != nil || again != got+1 {
				t.Fatalf("second epoch %d, %v; want %d", again, err, got+1)
			}
		})
	}
}

// TestRaiseEpoch: a held epoch above the persisted one is persisted, so
// the next session's epoch is above it whatever the clock says; one at or
// below it changes nothing; a corrupt file is refused, not overwritten.
func TestRaiseEpoch(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		held    uint64
		raised  bool
		next    uint64 // NextEpoch at clock 100 afterwards
		wantErr bool
	}{
		{"no file yet", "", 500, true, 501, false},
		{"above the persisted epoch", "200\n", 500, true, 501, false},
		{"below the persisted epoch", "800\n", 500, false, 801, false},
		{"equal to it", "500", 500, false, 501, false},
		{"below the clock: the clock still wins", "", 40, true, 100, false},
		{"corrupt file refused", "fifty", 500, false, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := epochFile(t, tt.file)
			raised, err := RaiseEpoch(path, tt.held)
			if (err != nil) != tt.wantErr || raised != tt.raised {
				t.Fatalf("RaiseEpoch = %v, %v; want %v (error %v)", raised, err, tt.raised, tt.wantErr)
			}
			if err != nil {
				if b, _ := os.ReadFile(path); string(b) != tt.file {
					t.Fatalf("the corrupt file was rewritten: %q", b)
				}
				return
			}
			if next, err := NextEpoch(path, 100); err != nil || next != tt.next {
				t.Fatalf("next epoch %d, %v; want %d", next, err, tt.next)
			}
		})
	}
}

func TestPortStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ports.json")
	busy := map[int]bool{20001: true}
	load := func() *Ports {
		ps, err := LoadPorts(path, 20000, 20003)
		if err != nil {
			t.Fatal(err)
		}
		ps.listenable = func(_ string, p int) bool { return !busy[p] }
		return ps
	}
	ps := load()
	steps := []struct {
		key     string
		want    int
		wantErr bool
	}{
		{"a/http", 20000, false},
		{"b/http", 20002, false}, // 20001 is held by someone else
		{"a/http", 20000, false}, // the same key keeps its port
		{"c/http", 20003, false},
		{"d/http", 0, true}, // range exhausted
	}
	for _, s := range steps {
		got, err := ps.Get(s.key, "127.0.0.1")
		if (err != nil) != s.wantErr || got != s.want {
			t.Fatalf("get(%s) = %d, %v; want %d", s.key, got, err, s.want)
		}
	}
	// Remembered across a restart.
	if got, _ := load().Get("b/http", "127.0.0.1"); got != 20002 {
		t.Errorf("after reload b/http got %d, want 20002", got)
	}
	if err := ps.Release("a/"); err != nil {
		t.Fatal(err)
	}
	if got, _ := ps.Get("d/http", "127.0.0.1"); got != 20000 {
		t.Errorf("released port not reused: got %d", got)
	}
}

func FuzzParseEpoch(f *testing.F) {
	for _, s := range []string{"1", "18446744073709551615\n", "", "-1", " 42 ", "1e9"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseEpoch(b)
		if err == nil && strings.TrimSpace(string(b)) == "" {
			t.Fatalf("empty input parsed as %d", v)
		}
	})
}

func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{`{"a/http":20000}`, `{}`, `null`, `{"x":0}`, `{"x":70000}`, `[1]`, `{"x":"1"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parsePorts(b)
		if err != nil {
			return
		}
		for k, p := range m {
			if p < 1 || p > 65535 {
				t.Fatalf("accepted %q -> %d", k, p)
			}
		}
	})
}

// TestPortStoreHold: an adopted engine's port stays its own — held even
// though it is not listenable, and never handed to another key.
func TestPortStoreHold(t *testing.T) {
	ps, err := LoadPorts(filepath.Join(t.TempDir(), "ports.json"), 20000, 20002)
	if err != nil {
		t.Fatal(err)
	}
	ps.listenable = func(string, int) bool { return true }
	steps := []struct {
		name    string
		do      func() (int, error)
		want    int
		wantErr bool
	}{
		{"hold", func() (int, error) { return 20000, ps.Hold("a/http", 20000) }, 20000, false},
		{"held", func() (int, error) { return ps.Held("a/http") }, 20000, false},
		{"another key skips it", func() (int, error) { return ps.Get("b/http", "127.0.0.1") }, 20001, false},
		{"hold of another's port", func() (int, error) { return 0, ps.Hold("c/http", 20001) }, 0, true},
		{"nothing held", func() (int, error) { return ps.Held("c/http") }, 0, true},
	}
	for _, s := range steps {
		got, err := s.do()
		if (err != nil) != s.wantErr || got != s.want {
			t.Errorf("%s: %d, %v; want %d, error %v", s.name, got, err, s.want, s.wantErr)
		}
	}
}
