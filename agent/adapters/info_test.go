package adapters

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestParseActivity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		found  bool
		active []string
		err    bool
	}{
		{name: "absent", body: "vllm:num_requests_running{engine=\"0\"} 1\n"},
		{name: "newest wins", found: true, active: []string{"legal", "sql"}, body: `# HELP vllm:lora_requests_info Running stats on lora requests.
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chem",waiting_lora_adapters=""} 1.69e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters="legal,sql"} 1.7e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e+09
`},
		{name: "idle", found: true, body: `vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9`},
		{name: "escapes", found: true, active: []string{`a"b`}, body: `vllm:lora_requests_info{running_lora_adapters="a\"b"} 1`},
		{name: "other metric with prefix", body: `vllm:lora_requests_info_other{running_lora_adapters="x"} 1`},
		{name: "bad value", err: true, body: `vllm:lora_requests_info{running_lora_adapters="x"} NaN`},
		{name: "unterminated", err: true, body: `vllm:lora_requests_info{running_lora_adapters="x} 1`},
	} {
		act, err := parseActivity([]byte(tc.body))
		if (err != nil) != tc.err {
			t.Errorf("%s: err %v", tc.name, err)
			continue
		}
		got := slices.Sorted(maps.Keys(act.active))
		if act.found != tc.found || !slices.Equal(got, tc.active) {
			t.Errorf("%s: found %v active %v, want %v %v", tc.name, act.found, got, tc.found, tc.active)
		}
	}
}

func TestParseModels(t *testing.T) {
	got, err := parseModels([]byte(`{"object":"list","data":[{"id":"m","parent":null},{"id":"sql","parent":"m","root":"/a"}]}`))
	if err != nil || !slices.Equal(got, []string{"sql"}) {
		t.Errorf("%v %v", got, err)
	}
	if _, err := parseModels([]byte(`{"data":`)); err == nil {
		t.Error("truncated body accepted")
	}
}

// FuzzParseActivity: any body is read or refused, never a panic, and an
// adapter named active is a non-empty trimmed name.
func FuzzParseActivity(f *testing.F) {
	f.Add([]byte(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters="a,b"} 1.7e+09`))
	f.Add([]byte(`vllm:lora_requests_info{a="\\\"\n"} 1 123`))
	f.Add([]byte("vllm:lora_requests_info 1\nvllm:lora_requests_info{"))
	f.Fuzz(func(t *testing.T, body []byte) {
		act, err := parseActivity(body)
		if err != nil {
			return
		}
		for name := range act.active {
			if name == "" || strings.TrimSpace(name) != name {
				t.Errorf("active name %q", name)
			}
		}
	})
}
