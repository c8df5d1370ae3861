package agent

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestLoadServiceServesRunningReplicas checks the wiring of design §6 "Load
// snapshots": the hello advertises LoadService on the advertise address and
// the bound port, and a subscriber is told of every READY replica under its
// incarnation. The fake engine serves no /metrics, so the replica is listed
// without a reading — which routers count as saturated.
func TestLoadServiceServesRunningReplicas(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	c.LoadInterval = 10 * time.Millisecond
	a, stop := startAgent(t, c)
	testkit.Wait(t, "hello", func() bool { h, _ := ctl.snapshot(); return len(h) == 1 })
	hellos, _ := ctl.snapshot()
	adv := hellos[0].GetNode().GetAgentGrpcAddr()
	host, port, err := net.SplitHostPort(adv)
	if err != nil || host != c.AdvertiseAddr || port == "0" || adv != a.GRPCAddr() {
		t.Fatalf("hello advertises LoadService at %q (agent says %q)", adv, a.GRPCAddr())
	}

	conn, err := grpc.NewClient(adv, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: "test"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetNode() != "n1" || first.GetIntervalNanos() != c.LoadInterval.Nanoseconds() {
		t.Fatalf("first snapshot %v, %v", first, err)
	}

	ctl.push <- desired(10, &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"})
	for {
		s, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream ended before demo-0 was listed: %v", err)
		}
		if len(s.GetReplicas()) == 1 {
			rl := s.GetReplicas()[0]
			if rl.GetReplicaId() != "demo-0" || rl.GetUid() != 5 || rl.GetIncarnation() != 1 || rl.GetScrapedUnixNano() != 0 {
				t.Fatalf("replica load %v", rl)
			}
			break
		}
	}
	testkit.Wait(t, "failed reads and the subscriber counted", func() bool {
		subs, ok := testkit.Scrape(a.HTTPAddr(), "llmgw_agent_load_subscribers", nil)
		_, failed := testkit.Scrape(a.HTTPAddr(), "llmgw_agent_load_reads_total", testkit.Labels{"result": "error"})
		return ok && subs == 1 && failed
	})
	// Stopping the agent ends the subscription: what was in flight drains,
	// then the stream fails.
	stop()
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
}

func TestValidateLoadFields(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"port 0", func(c *Config) { c.GRPCAddr = "127.0.0.1:0" }, ""},
		{"grpc addr", func(c *Config) { c.GRPCAddr = "nope" }, "--grpc-addr (grpc_addr)"},
		{"grpc port", func(c *Config) { c.GRPCAddr = "127.0.0.1:99999" }, "--grpc-addr (grpc_addr)"},
		{"load interval", func(c *Config) { c.LoadInterval = 0 }, "--load-interval (load_interval)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.NodeID = "n1"
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.want+":") {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}
