package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSummarize(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	tests := []struct {
		name string
		in   []time.Duration
		want summary
	}{
		{"none", nil, summary{}},
		{"one", ms(700), summary{N: 1, P50: 700 * time.Millisecond, P99: 700 * time.Millisecond, Max: 700 * time.Millisecond}},
		{"nearest rank of 100", ms(hundred...), summary{N: 100, P50: 50 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}},
		{"p99 of 101 is the max", ms(append(hundred, 5000)...), summary{N: 101, P50: 51 * time.Millisecond, P99: 100 * time.Millisecond, Max: 5000 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarize(tt.in); got != tt.want {
				t.Errorf("summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	ok := config{servers: 3, trials: 100, poll: 10 * time.Millisecond, heartbeatTimeout: time.Second, electionTimeout: time.Second, giveUpAfter: time.Second}
	tests := []struct {
		name   string
		mutate func(*config)
		want   string
	}{
		{"defaults", func(*config) {}, ""},
		{"two servers", func(c *config) { c.servers = 2 }, "--servers: must be at least 3, got 2"},
		{"no trials", func(c *config) { c.trials = 0 }, "--trials: must be at least 1, got 0"},
		{"no poll", func(c *config) { c.poll = 0 }, "--poll: must be positive, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.validate()
			if (err == nil) != (tt.want == "") || (err != nil && err.Error() != tt.want) {
				t.Errorf("validate = %v, want %q", err, tt.want)
			}
		})
	}
}
