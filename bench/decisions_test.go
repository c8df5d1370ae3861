package bench

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestParseDecisions(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Decisions
		err  string // substring; empty for none
	}{
		{"empty", "", Decisions{}, ""},
		{"tier 2's decisions", "llmgw_kv_decisions_total{decision=\"hit\"} 200\nllmgw_kv_decisions_total{decision=\"tokenize_timeout\"} 9",
			Decisions{"kv": {"hit": 200, "tokenize_timeout": 9}}, ""},
		{"both kinds, others skipped", `# HELP llmgw_prefix_decisions_total Tier 1.
# TYPE llmgw_prefix_decisions_total counter
llmgw_prefix_decisions_total{decision="hit"} 1902
llmgw_prefix_decisions_total{decision="load_override"} 729
llmgw_router_session_decisions_total{decision="new"} 180
llmgw_router_session_decisions_total{decision="hit"} 1.27e+03
llmgw_router_scheduling_seconds_bucket{le="0.001"} 5
go_goroutines 40
`, Decisions{"prefix": {"hit": 1902, "load_override": 729}, "session": {"new": 180, "hit": 1270}}, ""},
		{"other labels and a timestamp", `llmgw_prefix_decisions_total{router="r1",decision="miss",x="a,b"} 4 1700000000000`,
			Decisions{"prefix": {"miss": 4}}, ""},
		{"escaped label value", `llmgw_prefix_decisions_total{note="say \"hi\"",decision="a\\b"} 2`,
			Decisions{"prefix": {`a\b`: 2}}, ""},
		{"same decision twice adds", "llmgw_prefix_decisions_total{decision=\"hit\",r=\"1\"} 2\nllmgw_prefix_decisions_total{decision=\"hit\",r=\"2\"} 3",
			Decisions{"prefix": {"hit": 5}}, ""},
		{"no decision label", `llmgw_prefix_decisions_total{model="m"} 9`, Decisions{}, ""},
		{"a prefix of the name is another metric", `llmgw_prefix_decisions_total_extra{decision="hit"} 9`, Decisions{}, ""},
		{"bad count", `llmgw_prefix_decisions_total{decision="hit"} lots`, nil, `line 1: llmgw_prefix_decisions_total{decision="hit"}: bad count "lots"`},
		{"negative count", `llmgw_router_session_decisions_total{decision="hit"} -1`, nil, "bad count"},
		{"NaN count", `llmgw_router_session_decisions_total{decision="hit"} NaN`, nil, "bad count"},
		{"no value", `llmgw_prefix_decisions_total{decision="hit"}`, nil, "has no value"},
		{"sum overflows", "llmgw_prefix_decisions_total{decision=\"hit\",r=\"1\"} 1.7e308\nllmgw_prefix_decisions_total{decision=\"hit\",r=\"2\"} 1.7e308", nil, "line 2: llmgw_prefix_decisions_total{decision=\"hit\"}: count overflows"},
		{"unterminated labels", "go_x 1\nllmgw_prefix_decisions_total{decision=\"hit\" 3", nil, "line 2: unterminated labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDecisions(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseDecisions: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecisionsSince(t *testing.T) {
	before := Decisions{"session": {"hit": 10, "new": 3}, "prefix": {"miss": 7}}
	tests := []struct {
		name  string
		after Decisions
		want  Decisions
	}{
		{"nothing moved", Decisions{"session": {"hit": 10, "new": 3}, "prefix": {"miss": 7}}, Decisions{}},
		{"some moved, a new outcome appears", Decisions{"session": {"hit": 15, "new": 3, "load_override": 2}, "prefix": {"miss": 7}},
			Decisions{"session": {"hit": 5, "load_override": 2}}},
		{"a counter went down: restarted router", Decisions{"session": {"hit": 2, "new": 3}, "prefix": {"miss": 7}}, nil},
		{"a counter vanished: restarted router", Decisions{"session": {"hit": 12}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.after.since(before); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("since = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecisionsCell(t *testing.T) {
	d := Decisions{"session": {"new": 60, "hit": 230, "load_override": 12}}
	if got := d.cell("session"); got != "hit=230 load_override=12 new=60" {
		t.Fatalf("cell = %q", got)
	}
	if got := d.cell("prefix"); got != "-" {
		t.Fatalf("cell of an absent kind = %q, want -", got)
	}
	if got := Decisions(nil).cell("session"); got != "-" {
		t.Fatalf("cell of nil = %q, want -", got)
	}
}

// FuzzParseDecisions: a router's /metrics is outside input. Whatever it
// holds, the parser returns counts that are finite and not negative, or an
// error — never a panic.
func FuzzParseDecisions(f *testing.F) {
	for _, s := range []string{
		"",
		`llmgw_prefix_decisions_total{decision="hit"} 1902`,
		"llmgw_router_session_decisions_total{decision=\"new\",r=\"x\"} 1e3 17\n# c\ngo_x 1",
		`llmgw_prefix_decisions_total{decision="a\"b\\c\n"} 2`,
		`llmgw_prefix_decisions_total{decision=`,
		`llmgw_prefix_decisions_total{decision="hit"} +Inf`,
		`llmgw_prefix_decisions_total{=""} 1`,
		`llmgw_prefix_decisions_total}{ 1`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDecisions(strings.NewReader(s))
		if err != nil {
			return
		}
		for kind, m := range d {
			if kind != "session" && kind != "prefix" {
				t.Fatalf("unknown kind %q", kind)
			}
			for k, v := range m {
				if !(v >= 0) || math.IsInf(v, 0) {
					t.Fatalf("%s %q = %v", kind, k, v)
				}
			}
		}
	})
}
