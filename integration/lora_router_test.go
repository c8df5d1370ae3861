package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLoRARouterOnDemand (issue "LoRA adapters", plan §7.6): 2 sim
// replicas holding at most 2 adapters each, 6 adapters, two routers (the
// dev's and a second `llmgw router`). A burst for one cold adapter through
// both routers loads it once; skewed traffic over all six never has more
// than 2 held on an engine (the simulators' own high-water mark), and
// every request is answered 200 or 503 with Retry-After (all slots busy).
func TestLoRARouterOnDemand(t *testing.T) {
	d := startDev(t)
	r2 := startRouterProc(t, "r2", d.grpc)
	root := t.TempDir()
	names := []string{"a", "b", "c", "d", "e", "f"}
	yaml := "name: lora\nengine: sim\nmodel: org/base\nreplicas: 2\ngpus_per_replica: 1\nmax_loaded_adapters: 2\nmax_lora_rank: 16\nadapters:\n"
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(root, n), 0o755); err != nil {
			t.Fatal(err)
		}
		yaml += fmt.Sprintf("  - {name: %s, path: %s}\n", n, filepath.Join(root, n))
	}
	yaml += "extra_args: [\"--sim-decode-ms-per-token\", \"1\"]\n"
	file := filepath.Join(t.TempDir(), "lora.yaml")
	writeFile(t, file, yaml)
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ready := d.waitReady("lora", 2, 60*time.Second)
	routers := []string{"http://" + d.http, "http://" + r2.http}
	if !eventually(30*time.Second, func() bool {
		code, _ := postTo(t, routers[1]+"/v1/chat/completions", `{"model":"lora","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
		return code == 200
	}) {
		t.Fatal("the second router never served the base model")
	}
	chat := func(model string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"select 1"}],"max_tokens":2}`, model)
	}
	send := func(url, model string) int {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat(model)))
		if err != nil {
			t.Errorf("%s: %v", model, err)
			return 0
		}
		defer resp.Body.Close()
		if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", model)
		}
		return resp.StatusCode
	}

	// A burst for cold adapter a through both routers: one load.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 8 {
		wg.Go(func() {
			c := send(routers[i%2], "a")
			mu.Lock()
			codes[c]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200] != 8 {
		t.Errorf("burst for a cold adapter: %v, want 8 × 200", codes)
	}
	if loads := adapterLoads(t, ready, "a"); loads != 1 {
		t.Errorf("adapter a loaded %d times under a concurrent burst, want 1", loads)
	}

	// Skewed traffic over all six adapters, most weight on the first.
	weights := []int{12, 6, 4, 3, 2, 2}
	var seq []string
	for i, w := range weights {
		for range w {
			seq = append(seq, names[i])
		}
	}
	codes = map[int]int{}
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(seq); i += 4 {
				c := send(routers[i%2], seq[(i*7)%len(seq)])
				mu.Lock()
				codes[c]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("skewed traffic: %v", codes)
	for c := range codes {
		if c != 200 && c != 503 {
			t.Errorf("status %d in skewed traffic: %v", c, codes)
		}
	}
	for _, r := range ready {
		rep := simAdapters(t, r.Status.Address)
		if rep.MaxHeld > 2 {
			t.Errorf("%s held %d adapters at once, want at most 2", r.Replica.ID, rep.MaxHeld)
		}
		t.Logf("%s: max_held %d, adapters %+v", r.Replica.ID, rep.MaxHeld, rep.Adapters)
	}
	// Unknown adapter: 404 through either router.
	for _, u := range routers {
		if c := send(u, "zzz"); c != 404 {
			t.Errorf("%s: unknown adapter answered %d, want 404", u, c)
		}
	}
}

type simAdaptersReport struct {
	MaxHeld  int `json:"max_held"`
	Adapters []struct {
		Name  string `json:"name"`
		State string `json:"state"`
		Loads int    `json:"loads"`
	} `json:"adapters"`
}

func simAdapters(t *testing.T, addr string) simAdaptersReport {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/sim/adapters")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep simAdaptersReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func adapterLoads(t *testing.T, ready []replicaView, name string) int {
	n := 0
	for _, r := range ready {
		for _, a := range simAdapters(t, r.Status.Address).Adapters {
			if a.Name == name {
				n += a.Loads
			}
		}
	}
	return n
}
