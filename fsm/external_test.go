package fsm

import (
	"errors"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestPlaceExternalReplica holds the replica record of an external engine
// (design §5.5): it names one of its model's endpoints and no GPUs, and a
// replica of any other engine names no endpoint.
func TestPlaceExternalReplica(t *testing.T) {
	ext := &llmgwv1.Model{Name: "ext", Engine: "external", Endpoints: []string{"http://10.0.0.7:8000", "http://10.0.0.8:8000"}}
	tests := []struct {
		name    string
		replica *llmgwv1.Replica
		invalid string // "" = placed
	}{
		{"endpoint of the model", &llmgwv1.Replica{Model: "ext", Node: "n1", Endpoint: "http://10.0.0.8:8000"}, ""},
		{"no endpoint", &llmgwv1.Replica{Model: "ext", Node: "n1"}, "replica.endpoint"},
		{"another endpoint", &llmgwv1.Replica{Model: "ext", Node: "n1", Endpoint: "http://10.0.0.9:8000"}, "replica.endpoint"},
		{"with GPUs", &llmgwv1.Replica{Model: "ext", Node: "n1", Endpoint: "http://10.0.0.7:8000", GpuIndices: []uint32{0}}, "replica.gpu_indices"},
		{"endpoint on a sim replica", &llmgwv1.Replica{Model: "demo", Node: "n1", Endpoint: "http://10.0.0.7:8000", GpuIndices: []uint32{0}}, "replica.endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			applyAll(t, f, [][]byte{upsert(t, validModel()), upsert(t, ext), register(t, "n1", 1)})
			res, err := f.Apply(10, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: tt.replica}))
			if tt.invalid == "" {
				if err != nil {
					t.Fatalf("Apply: %v", err)
				}
				if r := res.(*llmgwv1.Replica); r.Endpoint != tt.replica.Endpoint || r.Id != "ext-0" {
					t.Fatalf("placed %v", r)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.invalid {
				t.Fatalf("err %v, want a validation error on %q", err, tt.invalid)
			}
			if len(f.State().Replicas) != 0 {
				t.Fatal("a refused placement placed a replica")
			}
		})
	}
}
