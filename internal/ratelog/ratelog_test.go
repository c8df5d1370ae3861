package ratelog

import (
	"fmt"
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(time.Minute, 3, func() time.Time { return now })
	steps := []struct {
		advance time.Duration
		key     string
		want    bool
	}{
		{0, "c4", true},
		{time.Second, "c4", false},
		{0, "c5", true},
		{58 * time.Second, "c4", false},
		{time.Second, "c4", true},
		{0, "c5", false}, // its minute is not up: it started a second later
		{time.Second, "c5", true},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := l.Allow(s.key); got != s.want {
			t.Fatalf("step %d: Allow(%s) = %v, want %v", i, s.key, got, s.want)
		}
	}
}

func TestAllowBoundsItsMemory(t *testing.T) {
	l := New(time.Hour, 8, nil)
	for i := range 1000 {
		l.Allow(fmt.Sprint("forged-", i))
	}
	if n := len(l.last); n > 8 {
		t.Fatalf("remembers %d keys, bound 8", n)
	}
}
