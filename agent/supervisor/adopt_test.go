package supervisor

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	rest := " 1 1 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10"
	tests := []struct {
		name, in  string
		state     string
		start     uint64
		wantError bool
	}{
		{"plain", "42 (vllm) S" + rest, "S", 777, false},
		{"name with spaces and parens", "42 (a) b (c)) Z" + rest, "Z", 777, false},
		{"no name", "42 vllm S" + rest, "", 0, true},
		{"short", "42 (vllm) S 1 1", "", 0, true},
		{"bad start", "42 (vllm) S 1 1 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 x 1000", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, start, err := parseStat([]byte(tt.in))
			if (err != nil) != tt.wantError || state != tt.state || start != tt.start {
				t.Errorf("parseStat = %q, %d, %v; want %q, %d, error %v", state, start, err, tt.state, tt.start, tt.wantError)
			}
		})
	}
}

func TestSameProcess(t *testing.T) {
	self := os.Getpid()
	start, err := ProcStartTime(self)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		pid   int
		start uint64
		want  bool
	}{
		{"itself", self, start, true},
		{"pid reused (another start time)", self, start + 1, false},
		{"no such pid", 1 << 30, start, false},
	}
	for _, tt := range tests {
		if got := SameProcess(tt.pid, tt.start); got != tt.want {
			t.Errorf("%s: SameProcess = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("42 (vllm) S 1 1 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10"))
	f.Add([]byte("1 ()) R"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = parseStat(b)
	})
}
