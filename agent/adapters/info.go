package adapters

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/vllm"
)

// activity is one reading of an engine's vllm:lora_requests_info: the
// adapters with requests running or waiting in the newest series.
type activity struct {
	// found is false when the engine exposes no such series (LoRA not
	// enabled, or an engine that is not vLLM).
	found   bool
	active  map[string]bool
	maxLoRA int
}

// parseActivity reads vllm:lora_requests_info from a Prometheus text body.
// vLLM's labelled gauge keeps every label combination it ever showed, each
// with the time it was last current as its value, so the newest series is
// the present one (vLLM's
// vllm/v1/metrics/loggers.py, PrometheusStatLogger). Only that metric's lines are parsed; a
// malformed one is an error, never a silent "idle".
func parseActivity(body []byte) (activity, error) {
	out := activity{active: map[string]bool{}}
	best := math.Inf(-1)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	prefix := []byte(vllm.MetricLoRARequestsInfo)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if !bytes.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		if len(rest) > 0 && rest[0] != '{' && rest[0] != ' ' {
			continue // another metric sharing the prefix
		}
		labels, value, err := parseSample(string(rest))
		if err != nil {
			return activity{}, fmt.Errorf("%s: %w", vllm.MetricLoRARequestsInfo, err)
		}
		if out.found && value <= best {
			continue
		}
		out.found, best = true, value
		clear(out.active)
		for _, key := range []string{vllm.LabelRunningLoRAAdapters, vllm.LabelWaitingLoRAAdapters} {
			for name := range strings.SplitSeq(labels[key], ",") {
				if name = strings.TrimSpace(name); name != "" {
					out.active[name] = true
				}
			}
		}
		out.maxLoRA, _ = strconv.Atoi(labels[vllm.LabelMaxLoRA])
	}
	if err := sc.Err(); err != nil {
		return activity{}, fmt.Errorf("%s: %w", vllm.MetricLoRARequestsInfo, err)
	}
	return out, nil
}

var errSample = errors.New("malformed sample")

// parseSample reads `{k="v",...} value [timestamp]` (the labels optional)
// with the text format's escapes in label values.
func parseSample(s string) (map[string]string, float64, error) {
	labels := map[string]string{}
	s = strings.TrimLeft(s, " ")
	if strings.HasPrefix(s, "{") {
		s = s[1:]
		for {
			s = strings.TrimLeft(s, " ,")
			if strings.HasPrefix(s, "}") {
				s = s[1:]
				break
			}
			eq := strings.IndexByte(s, '=')
			if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
				return nil, 0, fmt.Errorf("%w: label", errSample)
			}
			key := strings.TrimSpace(s[:eq])
			s = s[eq+2:]
			var val strings.Builder
			closed := false
			for i := 0; i < len(s); i++ {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					i++
					switch s[i] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(s[i])
					}
					continue
				}
				if c == '"' {
					s, closed = s[i+1:], true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, 0, fmt.Errorf("%w: unterminated label value", errSample)
			}
			labels[key] = val.String()
		}
	}
	fields := strings.Fields(s)
	if len(fields) < 1 || len(fields) > 2 {
		return nil, 0, fmt.Errorf("%w: value", errSample)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || math.IsNaN(v) {
		return nil, 0, fmt.Errorf("%w: value %q", errSample, fields[0])
	}
	return labels, v, nil
}
