package router

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// flowServer is a control server's FlowService: it keeps the last report
// and answers one fixed view.
type flowServer struct {
	llmgwv1.UnimplementedFlowServiceServer
	got chan *llmgwv1.FlowReport
}

func (f *flowServer) Report(_ context.Context, r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	f.got <- r
	return &llmgwv1.FlowView{ValidMs: 3000, Depths: []*llmgwv1.FlowDepth{{Model: "m", Class: "interactive", Queued: 2, Routers: 1}}}, nil
}

// TestReportFlow: the router's control adapter sends a flow report to a
// control server's FlowService and returns its answer.
func TestReportFlow(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &flowServer{got: make(chan *llmgwv1.FlowReport, 1)}
	srv := grpc.NewServer()
	llmgwv1.RegisterFlowServiceServer(srv, fs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	defer func() {
		srv.Stop()
		<-done
	}()
	c := &controlAdapters{addrs: func() []string { return []string{l.Addr().String()} }, conns: map[string]*grpc.ClientConn{}}
	defer c.close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &llmgwv1.FlowReport{Router: "r1", Session: 7, Depths: []*llmgwv1.FlowDepth{{Model: "m", Class: "batch", Rank: 1, Queued: 4}}}
	view, err := c.ReportFlow(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-fs.got; !proto.Equal(got, req) {
		t.Fatalf("the server got %v, want %v", got, req)
	}
	if view.ValidMs != 3000 || len(view.Depths) != 1 || view.Depths[0].Queued != 2 {
		t.Fatalf("view %v", view)
	}
}
