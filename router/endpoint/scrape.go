package endpoint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// vLLM's load gauges (plan §7.2). They move to the vllm package once it
// exists; the names are vLLM's and must not change.
const (
	MetricRunning = "vllm:num_requests_running"
	MetricWaiting = "vllm:num_requests_waiting"
	MetricKVUsage = "vllm:kv_cache_usage_perc"
	// metricKVUsageOld is the name vLLM used before v0.10; reading it too
	// keeps older engines routable by load.
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
)

// maxScrapeBytes bounds one /metrics body: vLLM's is tens of KiB; anything
// far beyond is not an engine we understand.
const maxScrapeBytes = 4 << 20

// Reading is one scrape of an engine's load.
type Reading struct {
	Waiting float64
	Running float64
	// KVUsage is the share of KV-cache blocks in use, 0..1.
	KVUsage float64
}

// parseLoad reads the three load gauges from Prometheus text exposition,
// summing each over its series (one per model_name, which matters once an
// engine serves adapters). Only these lines are parsed, so an exposition
// feature the router does not understand elsewhere in the body costs
// nothing. A body without the running and waiting gauges is an error: the
// replica is then treated as unread (saturated), not as idle.
func parseLoad(r io.Reader) (Reading, error) {
	var out Reading
	var sawRunning, sawWaiting, sawKV bool
	var kvOld float64
	var sawKVOld bool
	sc := bufio.NewScanner(io.LimitReader(r, maxScrapeBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, rest := splitName(line)
		var dst *float64
		switch name {
		case MetricRunning:
			dst, sawRunning = &out.Running, true
		case MetricWaiting:
			dst, sawWaiting = &out.Waiting, true
		case MetricKVUsage:
			dst, sawKV = &out.KVUsage, true
		case metricKVUsageOld:
			dst, sawKVOld = &kvOld, true
		default:
			continue
		}
		v, err := sampleValue(rest)
		if err != nil {
			return Reading{}, fmt.Errorf("metric %s: %w", name, err)
		}
		*dst += v
	}
	if err := sc.Err(); err != nil {
		return Reading{}, fmt.Errorf("read metrics: %w", err)
	}
	if !sawRunning || !sawWaiting {
		return Reading{}, errors.New("metrics: no vllm:num_requests_running or vllm:num_requests_waiting")
	}
	if !sawKV && sawKVOld {
		out.KVUsage = kvOld
	}
	return out, nil
}

// splitName returns the metric name of a sample line and what follows it.
func splitName(line []byte) (string, []byte) {
	i := bytes.IndexAny(line, "{ \t")
	if i < 0 {
		return string(line), nil
	}
	return string(line[:i]), line[i:]
}

// sampleValue parses `{labels} value [timestamp]`, skipping the label set
// with its quoting rules (a label value may hold '}' or spaces).
func sampleValue(rest []byte) (float64, error) {
	rest = bytes.TrimLeft(rest, " \t")
	if len(rest) > 0 && rest[0] == '{' {
		end, err := labelsEnd(rest)
		if err != nil {
			return 0, err
		}
		rest = rest[end:]
	}
	fields := strings.Fields(string(rest))
	if len(fields) == 0 || len(fields) > 2 {
		return 0, fmt.Errorf("malformed sample %q", rest)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0, fmt.Errorf("value: %w", err)
	}
	if v != v || v < 0 { // NaN or negative: not a load
		return 0, fmt.Errorf("value %v is not a load", v)
	}
	return v, nil
}

// labelsEnd returns the index just past the '}' closing the label set that
// b starts with.
func labelsEnd(b []byte) (int, error) {
	inQuote, escaped := false, false
	for i := 1; i < len(b); i++ {
		c := b[i]
		switch {
		case escaped:
			escaped = false
		case inQuote && c == '\\':
			escaped = true
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i + 1, nil
		}
	}
	return 0, errors.New("unterminated label set")
}
