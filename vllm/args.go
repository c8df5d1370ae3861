package vllm

import (
	"strconv"
	"strings"
)

// ArgValue reads option name ("--max-num-seqs") from an engine's command
// line as vLLM's argparse does: `--name V` or `--name=V`, "_" read as
// "-", the last one given winning. False when none is given with a value.
// It is for reading what a model's extra_args ask of its engines, which
// the control plane has already checked; it does not validate them.
func ArgValue(args []string, name string) (string, bool) {
	v, ok := "", false
	for i, a := range args {
		n, val, inline := strings.Cut(a, "=")
		if strings.ReplaceAll(n, "_", "-") != name {
			continue
		}
		if !inline {
			if i+1 >= len(args) || strings.HasPrefix(args[i+1], "--") {
				continue
			}
			val = args[i+1]
		}
		v, ok = val, true
	}
	return v, ok
}

// MaxNumSeqs is --max-num-seqs, a replica's batch capacity; false when
// none gives a positive number.
func MaxNumSeqs(args []string) (int, bool) {
	s, ok := ArgValue(args, "--max-num-seqs")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// PriorityScheduling reports whether args run vLLM's priority scheduler
// (--scheduling-policy priority): only then may a request carry a
// priority other than 0, which vLLM refuses otherwise.
func PriorityScheduling(args []string) bool {
	p, _ := ArgValue(args, "--scheduling-policy")
	return p == "priority"
}
