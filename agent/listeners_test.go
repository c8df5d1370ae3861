package agent

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestListenersBounded (issue 26): silent sockets from one address past
// its cap on LoadService and on the HTTP port evict that address's oldest
// silent ones, and are counted, while a router subscribes and /healthz
// answers from another address. (Their deadlines — gRPC's
// ConnectionTimeout, net/http's ReadHeaderTimeout — are the integration
// test's.)
func TestListenersBounded(t *testing.T) {
	control := startFakeControl(t, "c1")
	a, _ := startAgent(t, testConfig(t, control.addr))
	testkit.Wait(t, "the listeners to be open", func() bool { return a.GRPCAddr() != "" && a.HTTPAddr() != "" })
	for _, p := range []struct {
		addr string
		cap  int
	}{{a.GRPCAddr(), loadMaxConnsPerAddr}, {a.HTTPAddr(), httpMaxConnsPerAddr}} {
		for range p.cap + 5 {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}
	for _, l := range []string{"load", "http"} {
		testkit.WaitMetric(t, a.reg, "llmgw_agent_connections_dropped_total", testkit.Labels{"listener": l, "reason": "evicted_handshake"}, 5)
	}

	conn, err := grpc.NewClient("passthrough:///"+a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: "r1"})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatalf("a router's subscription beside the silent sockets: %v", err)
	}
	resp, err := http.Get("http://" + a.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatalf("/healthz beside the silent sockets: %v", err)
	}
	resp.Body.Close()
	if open := testkit.Metric(t, a.reg, "llmgw_agent_connections_open", testkit.Labels{"listener": "load"}); open != loadMaxConnsPerAddr+1 {
		t.Errorf("%v LoadService connections open, want the %d silent ones of the cap and the router's", open, loadMaxConnsPerAddr)
	}
}
