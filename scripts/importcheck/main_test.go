package main

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		p    pkg
		bad  int
	}{
		{"router may import proto and vllm", pkg{ImportPath: module + "/router/api", Imports: []string{module + "/proto/llmgw/v1", module + "/vllm", "net/http"}}, 0},
		{"router may not import agent", pkg{ImportPath: module + "/router", Imports: []string{module + "/agent"}}, 1},
		{"a test of controlplane may not import router", pkg{ImportPath: module + "/controlplane", TestImports: []string{module + "/router/watch"}}, 1},
		{"fsm may not import controlplane", pkg{ImportPath: module + "/fsm", XTestImports: []string{module + "/controlplane"}}, 1},
		{"sim may not import proto", pkg{ImportPath: module + "/sim", Imports: []string{module + "/proto/llmgw/v1"}}, 1},
		{"cmd may import anything", pkg{ImportPath: module + "/cmd/llmgw", Imports: []string{module + "/agent", module + "/router"}}, 0},
		{"own subpackages are fine", pkg{ImportPath: module + "/agent/engine", Imports: []string{module + "/agent/supervisor"}}, 0},
		{"a repeated import is reported once", pkg{ImportPath: module + "/sim", Imports: []string{module + "/fsm"}, TestImports: []string{module + "/fsm"}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(tt.p); len(got) != tt.bad {
				t.Fatalf("check() = %v, want %d violations", got, tt.bad)
			}
		})
	}
}
