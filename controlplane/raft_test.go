package controlplane

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestFSMAdapterStopsOnUnknownCommand(t *testing.T) {
	var fatal []error
	a := &fsmAdapter{fsm: fsm.New(fsm.Config{}), fatal: func(err error) { fatal = append(fatal, err) }, metrics: newMetrics(stubView{})}
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
		{"nothing applies after it", 3, register, errStopped, 1},
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
	if _, err := a.Snapshot(); !errors.Is(err, errStopped) {
		t.Fatalf("Snapshot after a fatal entry: %v, want errStopped", err)
	}
	if a.fsm.Revision() != 2 {
		t.Fatalf("revision %d, want 2: the FSM moved after the fatal entry", a.fsm.Revision())
	}
}

func TestHCLogWriter(t *testing.T) {
	tests := []struct {
		name string
		line string
		want []string
	}{
		{"json entry", `{"@level":"warn","@message":"heartbeat timeout","@module":"raft","error":"boom","node":"x"}` + "\n",
			[]string{"level=WARN", `msg="heartbeat timeout"`, "err=boom", "raft_node=x"}},
		{"debug", `{"@level":"debug","@message":"m"}`, []string{"level=DEBUG", "msg=m"}},
		{"not json", "plain text\n", []string{"level=INFO", `msg="plain text"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := &hclogWriter{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			if n, err := w.Write([]byte(tt.line)); err != nil || n != len(tt.line) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			for _, want := range tt.want {
				if !strings.Contains(buf.String(), want) {
					t.Fatalf("output %q lacks %q", buf.String(), want)
				}
			}
		})
	}
}

type stubView struct{}

func (stubView) hasLeader() bool                  { return false }
func (stubView) isLeader() bool                   { return false }
func (stubView) lastContactSeconds() float64      { return 0 }
func (stubView) revision() uint64                 { return 0 }
func (stubView) clusterFigures() (bool, int, int) { return false, 0, 0 }
