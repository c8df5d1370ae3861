package store

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestFSMAdapterStopsOnUnknownCommand(t *testing.T) {
	var fatal []error
	a := &fsmAdapter{fsm: fsm.New(fsm.Config{}), fatal: func(err error) { fatal = append(fatal, err) }, metrics: NewMetrics(prometheus.NewRegistry())}
	unknown, _ := proto.Marshal(&llmgwv1.Command{Type: 99, Version: 1})
	register, _ := fsm.NewCommand(llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: &llmgwv1.Node{Id: "n1"}})
	tests := []struct {
		name      string
		index     uint64
		data      []byte
		wantErr   error
		wantFatal int
	}{
		{"a known command applies", 1, register, nil, 0},
		{"an unknown one is fatal", 2, unknown, fsm.ErrUnknownCommand, 1},
		{"nothing applies after it", 3, register, ErrStopped, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.Apply(&raft.Log{Index: tt.index, Type: raft.LogCommand, Data: tt.data}).(applyResult)
			if !errors.Is(res.err, tt.wantErr) || (tt.wantErr == nil && res.err != nil) {
				t.Fatalf("Apply: %v, want %v", res.err, tt.wantErr)
			}
			if len(fatal) != tt.wantFatal {
				t.Fatalf("fatal called %d times, want %d", len(fatal), tt.wantFatal)
			}
		})
	}
	if _, err := a.Snapshot(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Snapshot after a fatal entry: %v, want ErrStopped", err)
	}
	if a.fsm.Revision() != 2 {
		t.Fatalf("revision %d, want 2: the FSM moved after the fatal entry", a.fsm.Revision())
	}
}
