package vllm

import (
	"strings"
	"testing"
)

func TestParseCacheConfig(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    CacheConfig
		found   bool
		wantErr string
	}{
		{"vLLM's", `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",num_gpu_blocks="27154",prefix_caching_hash_algo="sha256"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
`, CacheConfig{BlockSize: 16, NumGPUBlocks: 27154}, true, ""},
		{"a value holding a quote and a brace", `vllm:cache_config_info{note="a \"}\" here",num_gpu_blocks="8",block_size="32"} 1`,
			CacheConfig{BlockSize: 32, NumGPUBlocks: 8}, true, ""},
		{"blocks not yet known", `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1`, CacheConfig{BlockSize: 16}, true, ""},
		{"absent", "vllm:num_requests_running 0\n", CacheConfig{}, false, ""},
		{"not a number", `vllm:cache_config_info{num_gpu_blocks="many"} 1`, CacheConfig{}, false, `num_gpu_blocks "many"`},
		{"negative", `vllm:cache_config_info{num_gpu_blocks="-4"} 1`, CacheConfig{}, false, `num_gpu_blocks "-4"`},
		{"unterminated", `vllm:cache_config_info{num_gpu_blocks="4" 1`, CacheConfig{}, false, "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := ParseCacheConfig(strings.NewReader(tt.body))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || found != tt.found || got != tt.want {
				t.Fatalf("got %+v found %v err %v, want %+v found %v", got, found, err, tt.want, tt.found)
			}
		})
	}
}

func FuzzParseCacheConfig(f *testing.F) {
	f.Add(`vllm:cache_config_info{block_size="16",num_gpu_blocks="27154"} 1`)
	f.Add(`vllm:cache_config_info{a="\\",num_gpu_blocks="1"} 1`)
	f.Fuzz(func(t *testing.T, body string) {
		cfg, found, err := ParseCacheConfig(strings.NewReader(body))
		if err == nil && found && (cfg.BlockSize < 0 || cfg.NumGPUBlocks < 0) {
			t.Fatalf("negative %+v", cfg)
		}
	})
}
