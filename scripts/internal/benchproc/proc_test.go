package benchproc

import (
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        bool
	}{
		{"plain", "42 (llmgw) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 12 0 100 0 0", 2800 * time.Millisecond, false},
		{"spaces and parens in the name", "42 (a (b) c) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0", 100 * time.Millisecond, false},
		{"no name", "42 llmgw S", 0, true},
		{"short", "42 (llmgw) S 1 2", 0, true},
		{"not a number", "42 (llmgw) S 1 42 42 0 -1 0 0 0 0 0 x 3", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStatCPU([]byte(tc.stat))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseStatCPU = %v, %v; want %v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}
