package vllm

import "testing"

func TestMaxNumSeqs(t *testing.T) {
	tests := []struct {
		args []string
		want int
		ok   bool
	}{
		{nil, 0, false},
		{[]string{"--max-num-seqs", "32"}, 32, true},
		{[]string{"--max-num-seqs=32"}, 32, true},
		{[]string{"--max_num_seqs", "16"}, 16, true},
		{[]string{"--max-num-seqs", "8", "--max-num-seqs=24"}, 24, true}, // the last wins
		{[]string{"--max-num-seqs"}, 0, false},                           // no value
		{[]string{"--max-num-seqs", "--enforce-eager"}, 0, false},        // the next is an option
		{[]string{"--max-num-seqs", "lots"}, 0, false},
		{[]string{"--max-num-seqs=0"}, 0, false},
		{[]string{"--max-num-seqs-x", "8"}, 0, false},
		{[]string{"--max-num-batched-tokens", "8192"}, 0, false},
	}
	for _, tt := range tests {
		got, ok := MaxNumSeqs(tt.args)
		if got != tt.want || ok != tt.ok {
			t.Errorf("MaxNumSeqs(%q) = %d, %v; want %d, %v", tt.args, got, ok, tt.want, tt.ok)
		}
	}
}

func TestPriorityScheduling(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--scheduling-policy", "priority"}, true},
		{[]string{"--scheduling_policy=priority"}, true},
		{[]string{"--scheduling-policy", "fcfs"}, false},
		{[]string{"--scheduling-policy", "priority", "--scheduling-policy", "fcfs"}, false},
	} {
		if got := PriorityScheduling(tt.args); got != tt.want {
			t.Errorf("PriorityScheduling(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}
