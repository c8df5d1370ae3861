package agent

import (
	"testing"
	"time"
)

// TestLeaderlessSince: the three-election-timeout rule counts from raft's
// last contact with a leader, not from the first heartbeat tick that
// found none (which comes a heartbeat timeout plus up to a tick later).
func TestLeaderlessSince(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var never time.Time
	tests := []struct {
		name                            string
		lastContact, lastLed, firstSeen time.Time
		want                            time.Time
	}{
		{"a follower counts from its last contact", at(0), never, at(1200), at(0)},
		{"a deposed leader counts from when it last led", at(0), at(900), at(1200), at(900)},
		{"a leader's stale contact from before it led does not count", at(-60_000), at(900), at(1200), at(900)},
		{"a leader that came and went between ticks counts from its contact", at(1300), never, at(1000), at(1300)},
		{"no contact since start: from the first tick without a leader", never, never, at(1200), at(1200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := leaderlessSince(tt.lastContact, tt.lastLed, tt.firstSeen); !got.Equal(tt.want) {
				t.Fatalf("leaderlessSince = %v, want %v", got.Sub(t0), tt.want.Sub(t0))
			}
		})
	}
}
