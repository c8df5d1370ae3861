package vllm

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CacheConfig is what an engine's MetricCacheConfigInfo says of its KV
// cache: the one place vLLM publishes its block size and how many blocks
// its GPUs hold. Zero fields are absent labels.
type CacheConfig struct {
	// BlockSize is tokens per block (LabelCacheBlockSize).
	BlockSize int
	// NumGPUBlocks is how many blocks the engine's cache holds
	// (LabelCacheNumGPUBlocks): the most its KV events can ever describe
	// as stored at once, so the bound of a mirror of them.
	NumGPUBlocks int
}

// ParseCacheConfig reads MetricCacheConfigInfo's labels from Prometheus
// text exposition; found is false when the body has no such sample (an
// engine that is not vLLM, or one from before the metric). Only that
// metric's lines are parsed, as ParseLoad does, and at most
// MaxMetricsBytes are read. A label present with a value that is not a
// positive integer is an error, never a silent zero.
func ParseCacheConfig(r io.Reader) (cfg CacheConfig, found bool, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, MaxMetricsBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, rest := splitMetricName(line)
		if name != MetricCacheConfigInfo || len(rest) == 0 || rest[0] != '{' {
			continue
		}
		end, err := labelsEnd(rest)
		if err != nil {
			return CacheConfig{}, false, fmt.Errorf("metric %s: %w", name, err)
		}
		labels := string(rest[1 : end-1])
		for _, f := range []struct {
			label string
			into  *int
		}{{LabelCacheBlockSize, &cfg.BlockSize}, {LabelCacheNumGPUBlocks, &cfg.NumGPUBlocks}} {
			v, ok := LabelValue(labels, f.label)
			if !ok || v == "" || v == "None" { // vLLM renders an unset field as None
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return CacheConfig{}, false, fmt.Errorf("metric %s: %s %q is not a positive integer", name, f.label, v)
			}
			*f.into = n
		}
		return cfg, true, nil
	}
	if err := sc.Err(); err != nil {
		return CacheConfig{}, false, fmt.Errorf("read metrics: %w", err)
	}
	return CacheConfig{}, false, nil
}

// LabelValue finds name="value" in a sample's label set (without its
// braces), honouring the exposition format's escapes (\\, \", \n) inside
// values; false when the set has no such label or is malformed.
func LabelValue(labels, name string) (string, bool) {
	for len(labels) > 0 {
		eq := strings.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return "", false
		}
		key := strings.TrimSpace(strings.TrimLeft(labels[:eq], ", "))
		var val strings.Builder
		i := eq + 2
		for ; i < len(labels) && labels[i] != '"'; i++ {
			c := labels[i]
			if c == '\\' && i+1 < len(labels) {
				i++
				if labels[i] == 'n' {
					c = '\n'
				} else {
					c = labels[i]
				}
			}
			val.WriteByte(c)
		}
		if i >= len(labels) {
			return "", false
		}
		if key == name {
			return val.String(), true
		}
		labels = labels[i+1:]
	}
	return "", false
}
