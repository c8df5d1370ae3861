package leader

import (
	"testing"
	"time"
)

// TestAdapterQueueAhead: a call is ahead when it is for another adapter of
// the same model and its requests have waited longer; a tie goes to the
// lower adapter name, so every leader's routers agree.
func TestAdapterQueueAhead(t *testing.T) {
	tests := []struct {
		name    string
		queue   map[string][]queuedCall // model -> calls
		adapter string
		since   time.Time
		want    bool
	}{
		{"empty queue", nil, "a", t0, false},
		{"a call for another adapter waited longer", map[string][]queuedCall{"base": {{adapter: "b", since: t0.Add(-time.Second)}}}, "a", t0, true},
		{"a call for another adapter waited less", map[string][]queuedCall{"base": {{adapter: "b", since: t0.Add(time.Second)}}}, "a", t0, false},
		{"calls for the same adapter do not count", map[string][]queuedCall{"base": {{adapter: "a", since: t0.Add(-time.Hour)}}}, "a", t0, false},
		{"a tie goes to the lower name: ahead", map[string][]queuedCall{"base": {{adapter: "a", since: t0}}}, "b", t0, true},
		{"a tie goes to the lower name: behind", map[string][]queuedCall{"base": {{adapter: "b", since: t0}}}, "a", t0, false},
		{"any one call ahead is enough", map[string][]queuedCall{"base": {
			{adapter: "c", since: t0.Add(time.Minute)}, {adapter: "d", since: t0.Add(-time.Minute)}, {adapter: "a", since: t0.Add(-time.Hour)}}}, "a", t0, true},
		{"another model's queue does not count", map[string][]queuedCall{"other": {{adapter: "b", since: t0.Add(-time.Hour)}}}, "a", t0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newAdapterQueue()
			for m, calls := range tt.queue {
				for _, c := range calls {
					q.join(m, c)
				}
			}
			if got := q.ahead("base", tt.adapter, tt.since); got != tt.want {
				t.Fatalf("ahead(base, %s, %v) = %v, want %v", tt.adapter, tt.since, got, tt.want)
			}
		})
	}
}

// TestAdapterQueueJoinLeave: each call gets its own id; leave takes out
// that call only, ignores id 0 and ids already gone, and forgets a model
// whose queue empties.
func TestAdapterQueueJoinLeave(t *testing.T) {
	q := newAdapterQueue()
	older := queuedCall{adapter: "b", since: t0.Add(-time.Minute)}
	id1 := q.join("base", older)
	id2 := q.join("base", older) // the same adapter again: a second call
	id3 := q.join("other", queuedCall{adapter: "o", since: t0})
	if id1 == 0 || id1 == id2 || id2 == id3 || id1 == id3 {
		t.Fatalf("ids %d, %d, %d: want distinct and non-zero", id1, id2, id3)
	}
	if n := q.length("base"); n != 2 {
		t.Fatalf("length(base) = %d, want 2", n)
	}
	q.leave("base", 0)
	q.leave("base", id3) // other's id: not in base's queue
	if n := q.length("base"); n != 2 {
		t.Fatalf("length(base) = %d after leaving id 0 and another model's id, want 2", n)
	}
	q.leave("base", id1)
	if n := q.length("base"); n != 1 || !q.ahead("base", "a", t0) {
		t.Fatalf("after one of two calls left: length %d, ahead %v; want 1, true", n, q.ahead("base", "a", t0))
	}
	q.leave("base", id2)
	q.leave("base", id2)
	if n := q.length("base"); n != 0 || q.ahead("base", "a", t0) {
		t.Fatalf("after both left: length %d, ahead %v; want 0, false", n, q.ahead("base", "a", t0))
	}
	if _, ok := q.calls["base"]; ok {
		t.Fatal("an empty queue is still kept for base")
	}
	if n := q.length("other"); n != 1 {
		t.Fatalf("length(other) = %d, want 1", n)
	}
}
