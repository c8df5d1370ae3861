package console

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// ReplicaLoad is one engine's load as the console read it, or why not.
type ReplicaLoad struct {
	Waiting float64 `json:"waiting"`
	Running float64 `json:"running"`
	KVUsage float64 `json:"kv_usage"`
	Error   string  `json:"error,omitempty"`
}

// Load reads the live load of ready replicas from their engines' /metrics
// when a page asks: the control plane holds no load (agents stream it to
// routers only), and a console that shows a replica's state without its
// queue hides the thing an operator looks for first.
//
// Reads are bounded so that a page costs the engines little and never
// waits long: MaxReplicas engines per page, Parallel at a time, each within
// Timeout and vllm.MaxMetricsBytes.
type Load struct {
	Client      *http.Client
	Timeout     time.Duration
	Parallel    int
	MaxReplicas int
}

// NewLoad returns a Load with the defaults: 1 s per engine, 8 at a time,
// 256 engines per page.
func NewLoad() *Load {
	return &Load{Client: &http.Client{}, Timeout: time.Second, Parallel: 8, MaxReplicas: 256}
}

// loadNames is the engine's metric names by model engine; external models'
// endpoints are not ours to read.
func loadNames(engine string) (vllm.LoadNames, bool) {
	switch engine {
	case "vllm", "sim":
		return vllm.VLLMLoadNames, true
	case "llamacpp":
		return vllm.LlamaCppLoadNames, true
	}
	return vllm.LoadNames{}, false
}

// Read returns the load of every ready replica of reps, by replica id.
// Replicas that are not ready are absent: they take no traffic.
func (l *Load) Read(ctx context.Context, models []*llmgwv1.Model, reps []*llmgwv1.ReplicaView) map[string]ReplicaLoad {
	engines := map[string]string{}
	for _, m := range models {
		engines[m.Name] = m.Engine
	}
	out := map[string]ReplicaLoad{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, l.Parallel))
	n := 0
	for _, v := range reps {
		st := v.GetStatus()
		if st.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || st.GetAddress() == "" || st.GetUid() != v.GetReplica().GetUid() {
			continue
		}
		id := v.GetReplica().GetId()
		names, ok := loadNames(engines[v.GetReplica().GetModel()])
		if !ok {
			continue
		}
		if n++; n > l.MaxReplicas {
			out[id] = ReplicaLoad{Error: fmt.Sprintf("not read: more than %d ready replicas", l.MaxReplicas)}
			continue
		}
		addr := st.GetAddress()
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ld := l.readOne(ctx, addr, names)
			mu.Lock()
			out[id] = ld
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func (l *Load) readOne(ctx context.Context, addr string, names vllm.LoadNames) ReplicaLoad {
	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return ReplicaLoad{Error: err.Error()}
	}
	resp, err := l.Client.Do(req)
	if err != nil {
		return ReplicaLoad{Error: "unreachable: " + err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ReplicaLoad{Error: "metrics: " + resp.Status}
	}
	ld, err := vllm.ParseLoad(resp.Body, names)
	if err != nil {
		return ReplicaLoad{Error: err.Error()}
	}
	return ReplicaLoad{Waiting: ld.Waiting, Running: ld.Running, KVUsage: ld.KVUsage}
}
