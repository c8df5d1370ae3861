package main

import (
	"strings"
	"testing"
)

const page = `# HELP llmgw_router_flow_queued Requests waiting.
# TYPE llmgw_router_flow_queued gauge
llmgw_router_flow_queued{model="bench",class="interactive"} 3
llmgw_router_flow_queued{model="bench",class="batch"} 120
llmgw_router_flow_oldest_wait_seconds{class="interactive",model="bench"} 0.25
llmgw_router_flow_oldest_wait_seconds{model="other",class="interactive"} 9
llmgw_router_flow_dispatched_total{model="bench",class="batch",path="direct"} 10
llmgw_router_flow_dispatched_total{model="bench",class="batch",path="queued"} 1.5e+03
llmgw_router_flow_wait_seconds_bucket{model="bench",class="batch",le="+Inf"} 7
llmgw_router_flow_saturated{model="a \"quoted\", name"} 1 1700000000000
llmgw_router_flow_inversions_total 4
llmgw_router_requests_total{model="bench"} 99
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(page), "llmgw_router_flow_")
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 9 {
		t.Fatalf("%d samples, want 9 (the other prefix left out): %+v", len(s), s)
	}
	for _, tc := range []struct {
		name  string
		got   float64
		wantV float64
	}{
		{"batch dispatched, both paths", sum(s, "llmgw_router_flow_dispatched_total", map[string]string{"model": "bench", "class": "batch"}), 1510},
		{"queued path", sum(s, "llmgw_router_flow_dispatched_total", map[string]string{"path": "queued"}), 1500},
		{"oldest interactive of bench", most(s, "llmgw_router_flow_oldest_wait_seconds", map[string]string{"model": "bench", "class": "interactive"}), 0.25},
		{"oldest interactive anywhere", most(s, "llmgw_router_flow_oldest_wait_seconds", map[string]string{"class": "interactive"}), 9},
		{"a label with quotes and a comma", sum(s, "llmgw_router_flow_saturated", map[string]string{"model": `a "quoted", name`}), 1},
		{"no labels", sum(s, "llmgw_router_flow_inversions_total", nil), 4},
		{"le=+Inf", sum(s, "llmgw_router_flow_wait_seconds_bucket", map[string]string{"le": "+Inf"}), 7},
		{"absent", sum(s, "llmgw_router_flow_dropped_total", nil), 0},
	} {
		if tc.got != tc.wantV {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.wantV)
		}
	}
}

func TestParseLineErrors(t *testing.T) {
	for _, line := range []string{
		`m{a="x"`,
		`m{a="x} 1`,
		`m{a} 1`,
		`m{a="x"}`,
		`m`,
		`m{a="x"} one`,
	} {
		if _, err := parseLine(line); err == nil {
			t.Errorf("parseLine(%q): no error", line)
		}
	}
}
