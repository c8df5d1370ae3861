package vllm

import (
	"errors"
	"strings"
	"testing"
)

const vllmLoadText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
vllm:num_requests_running{engine="1",model_name="demo"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="demo"} 0.5
vllm:prompt_tokens_total{engine="0",model_name="demo"} 12345.0
`

const llamaCppLoadText = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4096
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
`

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		names   LoadNames
		want    Load
		wantErr error // nil: any error when wantAnyErr
		anyErr  bool
	}{
		{name: "vllm, summed over engines, fullest kv", body: vllmLoadText, names: VLLMLoadNames,
			want: Load{Waiting: 2, Running: 4, KVUsage: 0.5}},
		{name: "llama.cpp", body: llamaCppLoadText, names: LlamaCppLoadNames,
			want: Load{Waiting: 5, Running: 2, KVUsage: 0.125}},
		{name: "llama.cpp without kv ratio", body: "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n",
			names: LlamaCppLoadNames, want: Load{Running: 1}},
		{name: "llama.cpp text read as vllm", body: llamaCppLoadText, names: VLLMLoadNames, wantErr: ErrNoLoadGauges},
		{name: "no labels, timestamp", body: "vllm:num_requests_running 1 1700000000000\nvllm:num_requests_waiting 0\n",
			names: VLLMLoadNames, want: Load{Running: 1}},
		{name: "quoted brace and space in label",
			body:  `vllm:num_requests_running{model_name="a} b"} 5` + "\nvllm:num_requests_waiting{x=\"\\\"}\"} 1\n",
			names: VLLMLoadNames, want: Load{Running: 5, Waiting: 1}},
		{name: "old kv name", body: "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n",
			names: VLLMLoadNames, want: Load{KVUsage: 0.5}},
		{name: "new kv name wins", body: "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc 0.1\n",
			names: VLLMLoadNames, want: Load{KVUsage: 0.1}},
		{name: "missing gauges", body: "vllm:kv_cache_usage_perc 0.1\n", names: VLLMLoadNames, wantErr: ErrNoLoadGauges},
		{name: "empty body", body: "", names: VLLMLoadNames, wantErr: ErrNoLoadGauges},
		{name: "bad value", body: "vllm:num_requests_running{} abc\nvllm:num_requests_waiting 0\n", names: VLLMLoadNames, anyErr: true},
		{name: "negative", body: "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n", names: VLLMLoadNames, anyErr: true},
		{name: "infinite", body: "vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n", names: VLLMLoadNames, anyErr: true},
		{name: "unterminated labels", body: "vllm:num_requests_running{a=\"b 1\nvllm:num_requests_waiting 0\n", names: VLLMLoadNames, anyErr: true},
		{name: "too many fields", body: "vllm:num_requests_running 1 2 3\nvllm:num_requests_waiting 0\n", names: VLLMLoadNames, anyErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLoad(strings.NewReader(tt.body), tt.names)
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.anyErr:
				if err == nil {
					t.Fatalf("accepted: %+v", got)
				}
			case err != nil:
				t.Fatalf("err = %v", err)
			case got != tt.want:
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add(vllmLoadText, false)
	f.Add(llamaCppLoadText, true)
	f.Add("vllm:num_requests_running{a=\"\\\\\"} 1 2\n", false)
	f.Add("vllm:num_requests_waiting +Inf\nvllm:num_requests_running NaN\n", false)
	f.Fuzz(func(t *testing.T, body string, llama bool) {
		names := VLLMLoadNames
		if llama {
			names = LlamaCppLoadNames
		}
		l, err := ParseLoad(strings.NewReader(body), names)
		if err != nil {
			if l != (Load{}) {
				t.Fatalf("error %v with a load %+v", err, l)
			}
			return
		}
		if l.Waiting < 0 || l.Running < 0 || l.KVUsage < 0 || l.Waiting != l.Waiting || l.Running != l.Running {
			t.Fatalf("not a load accepted: %+v", l)
		}
	})
}
