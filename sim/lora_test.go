package sim

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// adapterDirs makes an adapter directory per name, since the simulator
// checks that an adapter's path exists as vLLM does.
func adapterDirs(t *testing.T, names ...string) map[string]string {
	t.Helper()
	root := t.TempDir()
	out := map[string]string{}
	for _, n := range names {
		p := filepath.Join(root, n)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		out[n] = p
	}
	return out
}

func loraConfig(maxLoRAs int, modules ...string) Config {
	cfg := testConfig()
	cfg.EnableLoRA, cfg.AllowRuntimeLoRAUpdating, cfg.MaxLoRAs = true, true, maxLoRAs
	cfg.LoRAModules = modules
	return cfg
}

func adaptersOf(t *testing.T, base string) AdaptersReport {
	t.Helper()
	resp, err := http.Get(base + "/sim/adapters")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep AdaptersReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func errorBody(t *testing.T, b []byte) vllm.ErrorBody {
	t.Helper()
	var e vllm.ErrorResponse
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Error
}

// TestLoRARuntimeAPI walks the runtime API through vLLM's answers, in
// order, on one engine holding at most two adapters.
func TestLoRARuntimeAPI(t *testing.T) {
	dirs := adapterDirs(t, "sql", "legal", "chem")
	_, ts := newTestServer(t, loraConfig(2))
	load := func(name, path string) string {
		b, _ := json.Marshal(map[string]string{"lora_name": name, "lora_path": path})
		return string(b)
	}
	for _, tc := range []struct {
		name, path, body string
		status           int
		// text is the whole 200 body; typ and msg the error's.
		text, typ, msg string
	}{
		{name: "load", path: "/v1/load_lora_adapter", body: load("sql", dirs["sql"]), status: 200,
			text: "Success: LoRA adapter 'sql' added successfully."},
		{name: "load again", path: "/v1/load_lora_adapter", body: load("sql", dirs["sql"]), status: 400,
			typ: vllm.ErrTypeInvalidInput, msg: "The lora adapter 'sql' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."},
		{name: "in place", path: "/v1/load_lora_adapter", body: `{"lora_name":"sql","lora_path":"` + dirs["sql"] + `","load_inplace":true}`,
			status: 200, text: "Success: LoRA adapter 'sql' added successfully."},
		{name: "no path", path: "/v1/load_lora_adapter", body: `{"lora_name":"x"}`, status: 400,
			typ: vllm.ErrTypeInvalidInput, msg: "Both 'lora_name' and 'lora_path' must be provided."},
		{name: "not json", path: "/v1/load_lora_adapter", body: `{`, status: 400, typ: vllm.ErrTypeBadRequest},
		{name: "missing path", path: "/v1/load_lora_adapter", body: load("ghost", "/no/such/adapter"), status: 404,
			typ: vllm.ErrTypeNotFound, msg: "Loading lora ghost failed: No adapter found for /no/such/adapter"},
		{name: "second", path: "/v1/load_lora_adapter", body: load("legal", dirs["legal"]), status: 200,
			text: "Success: LoRA adapter 'legal' added successfully."},
		{name: "over max-loras", path: "/v1/load_lora_adapter", body: load("chem", dirs["chem"]), status: 500,
			typ: vllm.ErrTypeInternalServer, msg: "Loading lora chem failed: 2 adapters are held and --max-loras is 2; unload one first"},
		{name: "unload", path: "/v1/unload_lora_adapter", body: `{"lora_name":"sql"}`, status: 200,
			text: "Success: LoRA adapter 'sql' removed successfully."},
		{name: "unload again", path: "/v1/unload_lora_adapter", body: `{"lora_name":"sql"}`, status: 404,
			typ: vllm.ErrTypeNotFound, msg: "The lora adapter 'sql' cannot be found."},
		{name: "unload no name", path: "/v1/unload_lora_adapter", body: `{"lora_int_id":3}`, status: 400,
			typ: vllm.ErrTypeInvalidInput, msg: "'lora_name' needs to be provided to unload a LoRA adapter."},
		{name: "room again", path: "/v1/load_lora_adapter", body: load("chem", dirs["chem"]), status: 200,
			text: "Success: LoRA adapter 'chem' added successfully."},
	} {
		resp, b := post(t, ts.URL+tc.path, tc.body)
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d (%s), want %d", tc.name, resp.StatusCode, b, tc.status)
		}
		if tc.status == 200 {
			if string(b) != tc.text {
				t.Errorf("%s: body %q, want %q", tc.name, b, tc.text)
			}
			continue
		}
		e := errorBody(t, b)
		if e.Code != tc.status || e.Type != tc.typ || (tc.msg != "" && e.Message != tc.msg) {
			t.Errorf("%s: error %+v, want %d %s %q", tc.name, e, tc.status, tc.typ, tc.msg)
		}
	}
	rep := adaptersOf(t, ts.URL)
	got := map[string]AdapterInfo{}
	for _, a := range rep.Adapters {
		got[a.Name] = a
	}
	if rep.Held != 2 || rep.MaxHeld != 2 || rep.MaxLoRAs != 2 {
		t.Errorf("report: %+v", rep)
	}
	for name, want := range map[string]struct {
		state          string
		loads, unloads int
	}{"sql": {"unloaded", 2, 1}, "legal": {"loaded", 1, 0}, "chem": {"loaded", 1, 0}} {
		if a := got[name]; a.State != want.state || a.Loads != want.loads || a.Unloads != want.unloads || a.BusyUnloads != 0 {
			t.Errorf("%s: %+v, want %+v", name, a, want)
		}
	}
}

func TestLoRARuntimeAPIOnlyWhenAllowed(t *testing.T) {
	cfg := loraConfig(1)
	cfg.AllowRuntimeLoRAUpdating = false
	_, ts := newTestServer(t, cfg)
	resp, b := post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/"}`)
	if resp.StatusCode != 404 || !strings.Contains(string(b), "Not Found") {
		t.Errorf("without VLLM_ALLOW_RUNTIME_LORA_UPDATING: %d %s", resp.StatusCode, b)
	}
	cfg = testConfig()
	cfg.AllowRuntimeLoRAUpdating = true
	_, ts = newTestServer(t, cfg)
	resp, b = post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/"}`)
	if e := errorBody(t, b); resp.StatusCode != 500 || e.Message != "LoRA is not enabled. Use --enable-lora to enable LoRA." {
		t.Errorf("without --enable-lora: %d %s", resp.StatusCode, b)
	}
}

// TestLoRAModulesModelsAndRequests: both --lora-modules forms are loaded
// at start, listed in /v1/models after the base model, and served by name;
// an adapter not loaded is an unknown model.
func TestLoRAModulesModelsAndRequests(t *testing.T) {
	dirs := adapterDirs(t, "sql", "legal")
	_, ts := newTestServer(t, loraConfig(2, "sql="+dirs["sql"],
		`{"name":"legal","path":"`+dirs["legal"]+`","base_model_name":"base-x"}`))
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list vllm.ModelList
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list.Data {
		ids = append(ids, c.ID)
	}
	if !slices.Equal(ids, []string{"llama", "sql", "legal"}) {
		t.Fatalf("models %v", ids)
	}
	for i, want := range []struct{ root, parent string }{{dirs["sql"], "llama"}, {dirs["legal"], "base-x"}} {
		c := list.Data[i+1]
		if c.Root != want.root || c.Parent == nil || *c.Parent != want.parent || c.MaxModelLen != nil || c.OwnedBy != "vllm" {
			t.Errorf("card %s: %+v", c.ID, c)
		}
	}
	for _, tc := range []struct {
		model  string
		status int
	}{{"sql", 200}, {"legal", 200}, {"llama", 200}, {"chem", 404}} {
		body := strings.Replace(chatBody("hi", `,"max_tokens":2`), `"model":"llama"`, `"model":"`+tc.model+`"`, 1)
		resp, b := post(t, ts.URL+"/v1/chat/completions", body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s", tc.model, resp.StatusCode, b)
			continue
		}
		if tc.status == 200 {
			var c vllm.ChatCompletion
			if err := json.Unmarshal(b, &c); err != nil || c.Model != tc.model {
				t.Errorf("%s: answered as %q (%v)", tc.model, c.Model, err)
			}
		} else if e := errorBody(t, b); e.Type != vllm.ErrTypeNotFound {
			t.Errorf("%s: %+v", tc.model, e)
		}
	}
	// The completions API takes adapters too.
	if resp, b := post(t, ts.URL+"/v1/completions", `{"model":"sql","prompt":"x","max_tokens":1}`); resp.StatusCode != 200 {
		t.Errorf("completion on adapter: %d %s", resp.StatusCode, b)
	}
}

func TestLoRAConfigErrors(t *testing.T) {
	dirs := adapterDirs(t, "a")
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"modules without enable", func(c *Config) { c.EnableLoRA = false; c.LoRAModules = []string{"a=" + dirs["a"]} }, "requires --enable-lora"},
		{"bad item", func(c *Config) { c.LoRAModules = []string{"nonsense"} }, "neither name=path nor JSON"},
		{"json without path", func(c *Config) { c.LoRAModules = []string{`{"name":"a"}`} }, "name and path are required"},
		{"empty name", func(c *Config) { c.LoRAModules = []string{"=/x"} }, "want name=path"},
		{"twice", func(c *Config) { c.MaxLoRAs = 3; c.LoRAModules = []string{"a=/x", "a=/y"} }, "used twice"},
		{"base name", func(c *Config) { c.MaxLoRAs = 3; c.LoRAModules = []string{"llama=/x"} }, "used twice"},
		{"over max", func(c *Config) { c.LoRAModules = []string{"a=/x", "b=/y"} }, "exceed --max-loras 1"},
		{"delay", func(c *Config) { c.LoRALoadDelay = -1 }, "--sim-lora-load-delay"},
		{"missing static path", func(c *Config) { c.LoRAModules = []string{"a=/no/such/dir"} }, "Loading lora a failed: No adapter found for /no/such/dir"},
	} {
		cfg := loraConfig(1)
		tc.mut(&cfg)
		_, err := New(cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// loraBlocks records the adapter of every stored block.
type loraBlocks struct {
	mu     sync.Mutex
	blocks []StoredBlock
}

func (o *loraBlocks) BlocksStored(_ *vllm.BlockHash, blocks []StoredBlock) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.blocks = append(o.blocks, blocks...)
}
func (o *loraBlocks) BlocksRemoved([]vllm.BlockHash) {}
func (o *loraBlocks) AllBlocksCleared()              {}

// TestLoRABlockHashes: the same prompt under an adapter hashes to other
// blocks than under the base model (the name is each block's extra key),
// its blocks are tagged with the adapter, and a second request under the
// adapter hits its cache.
func TestLoRABlockHashes(t *testing.T) {
	dirs := adapterDirs(t, "sql")
	obs := &loraBlocks{}
	_, ts := newTestServer(t, loraConfig(1, "sql="+dirs["sql"]), WithCacheObserver(obs))
	prompt := `"prompt":"` + strings.Repeat("tell me about caches ", 20) + `","max_tokens":1}`
	chat := func(model string) vllm.Usage {
		resp, b := post(t, ts.URL+"/v1/completions", `{"model":"`+model+`",`+prompt)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
		var c vllm.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return *c.Usage
	}
	chat("llama")
	if u := chat("sql"); u.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("adapter hit the base model's blocks: %+v", u.PromptTokensDetails)
	}
	if u := chat("sql"); u.PromptTokensDetails.CachedTokens == 0 {
		t.Error("adapter's second request missed its own blocks")
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	base, lora := map[vllm.BlockHash]bool{}, map[vllm.BlockHash]bool{}
	for _, b := range obs.blocks {
		switch b.LoRAName {
		case "":
			base[b.Hash] = true
		case "sql":
			if b.LoRAID != 1 {
				t.Errorf("lora id %d, want 1", b.LoRAID)
			}
			lora[b.Hash] = true
		}
	}
	if len(base) == 0 || len(lora) == 0 {
		t.Fatalf("base %d and adapter %d blocks: the test proves nothing", len(base), len(lora))
	}
	for h := range lora {
		if base[h] {
			t.Errorf("block %x cached under both", h)
		}
	}
}

// TestLoRAKVEvents: a stored block of an adapter's request carries
// lora_name, lora_id and the name as its extra key; a base block None.
func TestLoRAKVEvents(t *testing.T) {
	cfg := testConfig()
	p := newKVPublisher(&cfg, KVEventsConfig{}, slog.New(slog.DiscardHandler), time.Now, func() Faults { return Faults{} })
	p.BlocksStored(nil, []StoredBlock{{Hash: vllm.BlockHash{1}, Tokens: make([]int, 16), LoRAName: "sql", LoRAID: 3},
		{Hash: vllm.BlockHash{2}, Tokens: make([]int, 16), LoRAName: "sql", LoRAID: 3}})
	p.BlocksStored(nil, []StoredBlock{{Hash: vllm.BlockHash{3}, Tokens: make([]int, 16)}})
	if len(p.pending) != 2 {
		t.Fatalf("pending %d", len(p.pending))
	}
	e := p.pending[0].(*vllm.BlockStored)
	if e.LoRAName == nil || *e.LoRAName != "sql" || e.LoRAID == nil || *e.LoRAID != 3 {
		t.Errorf("adapter event: name %v id %v", e.LoRAName, e.LoRAID)
	}
	for i, k := range e.ExtraKeys {
		if len(k) != 1 || k[0] != "sql" {
			t.Errorf("extra keys[%d] = %v", i, k)
		}
	}
	e = p.pending[1].(*vllm.BlockStored)
	if e.LoRAName != nil || e.LoRAID != nil || len(e.ExtraKeys) != 1 || e.ExtraKeys[0] != nil {
		t.Errorf("base event: %+v", e)
	}
}

func scrapeLoRAInfo(t *testing.T, base string) []string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, vllm.MetricLoRARequestsInfo+"{") {
			out = append(out, line)
		}
	}
	return out
}

// TestLoRARequestsInfo: the gauge names the adapters with running and
// waiting requests, max_lora, the current time as value, and keeps the
// stale combinations as vLLM's labelled gauge does.
func TestLoRARequestsInfo(t *testing.T) {
	dirs := adapterDirs(t, "sql", "legal")
	cfg := loraConfig(2, "sql="+dirs["sql"], "legal="+dirs["legal"])
	cfg.MaxNumSeqs, cfg.DecodePerToken = 1, time.Millisecond
	gate := newGateClock()
	s, ts := newTestServer(t, cfg, WithClock(gate))
	if got := scrapeLoRAInfo(t, ts.URL); len(got) != 1 ||
		got[0] != `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09` {
		t.Fatalf("idle: %q", got)
	}
	// One sql request runs (held at its first decode step by the gate
	// clock) while a legal request waits for the only slot.
	done := make(chan struct{}, 2)
	for _, m := range []string{"sql", "legal"} {
		body := `{"model":"` + m + `","prompt":"x","max_tokens":3}`
		go func() {
			defer func() { done <- struct{}{} }()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		testkit.Wait(t, m+" arrives", func() bool {
			for _, a := range s.lora.report().Adapters {
				if a.Name == m && a.Running+a.Waiting == 1 {
					return true
				}
			}
			return false
		})
	}
	got := scrapeLoRAInfo(t, ts.URL)
	want := `vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters="legal"} 1.7e+09`
	if !slices.Contains(got, want) || len(got) != 2 {
		t.Errorf("busy: %q, want %q among two series", got, want)
	}
	// An unload while a request for the adapter runs is counted as busy.
	if resp, b := post(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); resp.StatusCode != 200 {
		t.Fatalf("unload sql: %d %s", resp.StatusCode, b)
	}
	for _, a := range s.lora.report().Adapters {
		if want := map[string]int{"sql": 1, "legal": 0}[a.Name]; a.BusyUnloads != want {
			t.Errorf("%s: busy unloads %d, want %d", a.Name, a.BusyUnloads, want)
		}
	}
	close(gate.step) // let every sleep through
	<-done
	<-done
}

// TestLoRARequestsInfoFrozen: with --sim-lora-info-frozen the gauge keeps
// the first adapters it named as its newest series once they are idle,
// and once others run: an activity metric stuck busy (issue 27).
func TestLoRARequestsInfoFrozen(t *testing.T) {
	cfg := loraConfig(2)
	cfg.LoRAInfoFrozen = true
	now := 1.0
	l := newLoRASet(&cfg, func() float64 { return now })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newLoRAInfo(l))
	newest := func() string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		best, at := "", -1.0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if v := m.GetGauge().GetValue(); v > at {
					best, at = "", v
					for _, lp := range m.GetLabel() {
						best += lp.GetName() + "=" + lp.GetValue() + ";"
					}
				}
			}
		}
		return best
	}
	set := func(name string, running int) {
		l.mu.Lock()
		l.statsLocked(name, "").running = running
		l.mu.Unlock()
		now++
	}
	idle := "max_lora=2;running_lora_adapters=;waiting_lora_adapters=;"
	if got := newest(); got != idle {
		t.Fatalf("before any request: %q, want %q", got, idle)
	}
	set("sql", 1)
	want := "max_lora=2;running_lora_adapters=sql;waiting_lora_adapters=;"
	for _, step := range []func(){func() {}, func() { set("sql", 0) }, func() { set("legal", 1) }} {
		step()
		if got := newest(); got != want {
			t.Errorf("newest series %q, want it frozen at %q", got, want)
		}
	}
}

// FuzzParseLoRAModule: any item is parsed or refused with an error, and a
// parsed one always has a name and a path.
func FuzzParseLoRAModule(f *testing.F) {
	for _, s := range []string{"sql=/a/sql", `{"name":"x","path":"/a,b"}`, "=", "a=b,c", `{"name":1}`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, item string) {
		m, err := ParseLoRAModule(item)
		if err == nil && (m.Name == "" || m.Path == "") {
			t.Errorf("%q parsed to %+v", item, m)
		}
	})
}
