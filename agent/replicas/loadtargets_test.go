package replicas

import (
	"testing"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/vllm"
)

func TestLoadNames(t *testing.T) {
	tests := []struct {
		engine string
		want   vllm.LoadNames
	}{
		{engine.VLLM, vllm.VLLMLoadNames},
		{engine.Sim, vllm.VLLMLoadNames},
		{engine.External, vllm.VLLMLoadNames},
		{engine.LlamaCpp, vllm.LlamaCppLoadNames},
	}
	for _, tt := range tests {
		if got := loadNames(tt.engine); got != tt.want {
			t.Errorf("loadNames(%q) = %+v, want %+v", tt.engine, got, tt.want)
		}
	}
}
