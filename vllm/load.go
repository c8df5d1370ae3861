package vllm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// llama.cpp's llama-server (with --metrics) names its load gauges
// differently (design §6 "Drivers"): a reader maps them through LoadNames.
// The KV ratio disappeared from newer llama-server builds, so it is
// optional, as vLLM's is.
const (
	MetricLlamaCppRequestsProcessing = "llamacpp:requests_processing"
	MetricLlamaCppRequestsDeferred   = "llamacpp:requests_deferred"
	MetricLlamaCppKVCacheUsageRatio  = "llamacpp:kv_cache_usage_ratio"
)

// MaxMetricsBytes bounds one /metrics body a load reader accepts: vLLM's is
// tens of KiB; anything far beyond is not an engine we understand.
const MaxMetricsBytes = 4 << 20

// Load is one reading of an engine's load gauges (design §7.2).
type Load struct {
	// Waiting and Running are requests queued and in the running batch,
	// summed over the engine's series (data-parallel engines, model names).
	Waiting, Running float64
	// KVUsage is the share of KV-cache blocks in use, 0..1: the fullest
	// series, since a data-parallel engine is as full as its fullest rank
	// for the request that lands there.
	KVUsage float64
}

// LoadNames maps an engine's metric names onto Load. Running and Waiting
// are required in a body; KVUsage (or, when absent, KVUsageFallback) is
// optional, read as 0 when missing.
type LoadNames struct {
	Running, Waiting         string
	KVUsage, KVUsageFallback string
}

// VLLMLoadNames are vLLM's (and the simulator's) gauges; the fallback is the
// KV name vLLM used before 0.9.2, so older engines stay routable by load.
var VLLMLoadNames = LoadNames{
	Running:         MetricNumRequestsRunning,
	Waiting:         MetricNumRequestsWaiting,
	KVUsage:         MetricKVCacheUsagePerc,
	KVUsageFallback: MetricGPUCacheUsagePerc,
}

// LlamaCppLoadNames are llama-server's: slots processing are the running
// batch, deferred requests the queue.
var LlamaCppLoadNames = LoadNames{
	Running: MetricLlamaCppRequestsProcessing,
	Waiting: MetricLlamaCppRequestsDeferred,
	KVUsage: MetricLlamaCppKVCacheUsageRatio,
}

// ErrNoLoadGauges is returned for a body that lacks the running or waiting
// gauge: such an engine is unread (saturated), never idle.
var ErrNoLoadGauges = errors.New("metrics: no running or waiting gauge")

// ParseLoad reads the load gauges named by names from Prometheus text
// exposition. Only those lines are parsed, so an exposition feature it does
// not understand elsewhere in the body costs nothing; a malformed line of
// one of them is an error, never a silent zero. At most MaxMetricsBytes are
// read.
func ParseLoad(r io.Reader, names LoadNames) (Load, error) {
	var out Load
	var sawRunning, sawWaiting, sawKV, sawKVOld bool
	var kvOld float64
	sc := bufio.NewScanner(io.LimitReader(r, MaxMetricsBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, rest := splitMetricName(line)
		if name == "" {
			continue
		}
		var v float64
		var err error
		switch name {
		case names.Running, names.Waiting, names.KVUsage, names.KVUsageFallback:
			if v, err = sampleValue(rest); err != nil {
				return Load{}, fmt.Errorf("metric %s: %w", name, err)
			}
		default:
			continue
		}
		switch name {
		case names.Running:
			out.Running += v
			sawRunning = true
		case names.Waiting:
			out.Waiting += v
			sawWaiting = true
		case names.KVUsage:
			out.KVUsage = max(out.KVUsage, v)
			sawKV = true
		case names.KVUsageFallback:
			kvOld = max(kvOld, v)
			sawKVOld = true
		}
	}
	if err := sc.Err(); err != nil {
		return Load{}, fmt.Errorf("read metrics: %w", err)
	}
	if !sawRunning || !sawWaiting {
		return Load{}, fmt.Errorf("%w (want %s and %s)", ErrNoLoadGauges, names.Running, names.Waiting)
	}
	if !sawKV && sawKVOld {
		out.KVUsage = kvOld
	}
	return out, nil
}

// splitMetricName returns the metric name of a sample line and what follows
// it.
func splitMetricName(line []byte) (string, []byte) {
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
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
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
