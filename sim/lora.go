package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/vllm"
)

// LoRAModule is one --lora-modules item: an adapter registered at start.
type LoRAModule struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// BaseModelName is the adapter card's parent in /v1/models; empty
	// means the first served name, as in vLLM.
	BaseModelName string `json:"base_model_name"`
}

// ParseLoRAModule reads one --lora-modules item by vLLM's rule
// (LoRAParserAction): `name=path` when the item has "=" and no ",",
// otherwise JSON with at least name and path.
func ParseLoRAModule(item string) (LoRAModule, error) {
	if strings.Contains(item, "=") && !strings.Contains(item, ",") {
		name, path, _ := strings.Cut(item, "=")
		if name == "" || path == "" {
			return LoRAModule{}, fmt.Errorf("--lora-modules: %q: want name=path", item)
		}
		return LoRAModule{Name: name, Path: path}, nil
	}
	var m LoRAModule
	dec := json.NewDecoder(strings.NewReader(item))
	if err := dec.Decode(&m); err != nil {
		return LoRAModule{}, fmt.Errorf("--lora-modules: %q: neither name=path nor JSON: %w", item, err)
	}
	if m.Name == "" || m.Path == "" {
		return LoRAModule{}, fmt.Errorf("--lora-modules: %q: name and path are required", item)
	}
	return m, nil
}

// validateLoRA checks the LoRA flags for Config.Validate.
func (c *Config) validateLoRA() []error {
	var errs []error
	if len(c.LoRAModules) > 0 && !c.EnableLoRA {
		errs = append(errs, errors.New("--lora-modules: requires --enable-lora"))
	}
	seen := map[string]bool{}
	for _, item := range c.LoRAModules {
		m, err := ParseLoRAModule(item)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[m.Name] || slices.Contains(c.ServedNames(), m.Name) {
			errs = append(errs, fmt.Errorf("--lora-modules: %q: name used twice", m.Name))
		}
		seen[m.Name] = true
	}
	// The simulator holds at most --max-loras adapters (see loraSet), so
	// more static modules than that could never all be served.
	if c.MaxLoRAs >= 1 && len(seen) > c.MaxLoRAs {
		errs = append(errs, fmt.Errorf("--lora-modules: %d adapters exceed --max-loras %d", len(seen), c.MaxLoRAs))
	}
	if c.LoRALoadDelay < 0 {
		errs = append(errs, errors.New("--sim-lora-load-delay: must not be negative"))
	}
	return errs
}

// loraSet is the engine's adapters: those loaded (requests may name them),
// those being loaded, and per-name counters that outlive an unload, for
// tests to read through GET /sim/adapters.
//
// The simulator holds at most maxLoRAs adapters, loading ones included,
// and refuses a load beyond that with a 500. vLLM is laxer: --max-loras
// bounds one batch and --max-cpu-loras its cache, from which it evicts the
// least recently used adapter to make room. Refusing instead makes an
// agent or control plane that over-fills a replica fail loudly in tests
// (design §7.6 "never more than N per replica"), which is the simulator's job.
//
// It is safe for concurrent use.
type loraSet struct {
	enabled bool
	max     int
	base    string
	now     func() float64

	mu       sync.Mutex
	nextID   int
	adapters map[string]*loraAdapter // loading or loaded
	stats    map[string]*loraStats   // every name ever loaded or asked for
	highMark int                     // most adapters held at once
	// info holds each label combination vllm:lora_requests_info has shown
	// and when it was last current: vLLM's labelled gauge keeps stale
	// series, and a reader must pick the newest.
	info map[loraInfoKey]float64
	// freeze is --sim-lora-info-frozen; frozen is then the first label
	// combination that named an adapter, shown as current from then on.
	freeze bool
	frozen *loraInfoKey
}

type loraAdapter struct {
	name, path, parent string
	id                 int
	loading            bool
}

type loraStats struct {
	path             string
	loads, unloads   int
	running, waiting int
	// busyUnloads counts unloads made while requests for the adapter ran
	// or waited in this engine: exact, where a test sampling the engine
	// from outside could only bracket an unload between two readings.
	busyUnloads int
}

type loraInfoKey struct{ running, waiting string }

// maxLoRAInfoSeries bounds the stale series kept: enough to show a reader
// that old ones exist, not a leak over a long benchmark.
const maxLoRAInfoSeries = 32

func newLoRASet(cfg *Config, now func() float64) *loraSet {
	return &loraSet{enabled: cfg.EnableLoRA, max: cfg.MaxLoRAs, base: cfg.ServedNames()[0], now: now,
		adapters: map[string]*loraAdapter{}, stats: map[string]*loraStats{}, info: map[loraInfoKey]float64{},
		freeze: cfg.LoRAInfoFrozen}
}

// loadStatic registers the --lora-modules adapters, as vLLM does before it
// serves: a missing path stops the engine from starting.
func (l *loraSet) loadStatic(items []string) error {
	for _, item := range items {
		m, _ := ParseLoRAModule(item) // valid: checked by Validate
		if err := checkAdapterPath(m.Path); err != nil {
			return fmt.Errorf("--lora-modules: Loading lora %s failed: %w", m.Name, err)
		}
		parent := m.BaseModelName
		if parent == "" {
			parent = l.base
		}
		l.mu.Lock()
		l.nextID++
		l.adapters[m.Name] = &loraAdapter{name: m.Name, path: m.Path, parent: parent, id: l.nextID}
		l.statsLocked(m.Name, m.Path).loads++
		l.highMark = max(l.highMark, len(l.adapters))
		l.mu.Unlock()
	}
	return nil
}

// checkAdapterPath is the simulator's stand-in for reading a PEFT
// adapter: the path must exist on this machine.
func checkAdapterPath(path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("No adapter found for %s", path) //nolint:staticcheck // ST1005: vLLM's LoRAAdapterNotFoundError wording, verbatim
	}
	return nil
}

func (l *loraSet) statsLocked(name, path string) *loraStats {
	st := l.stats[name]
	if st == nil {
		st = &loraStats{}
		l.stats[name] = st
	}
	if path != "" {
		st.path = path
	}
	return st
}

// lookup returns a loaded adapter's name and id; ok is false for anything
// else, loading adapters included (vLLM registers a name once loaded).
func (l *loraSet) lookup(name string) (id int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.adapters[name]
	if a == nil || a.loading {
		return 0, false
	}
	return a.id, true
}

// loraActivity is one request's mark on its adapter's counters: waiting
// from arrival, running once admitted, gone when done.
type loraActivity struct {
	l       *loraSet
	name    string
	running bool
}

func (l *loraSet) arrive(name string) *loraActivity {
	if name == "" {
		return nil
	}
	l.mu.Lock()
	l.statsLocked(name, "").waiting++
	l.mu.Unlock()
	return &loraActivity{l: l, name: name}
}

func (a *loraActivity) run() {
	if a == nil {
		return
	}
	a.l.mu.Lock()
	st := a.l.stats[a.name]
	st.waiting--
	st.running++
	a.running = true
	a.l.mu.Unlock()
}

func (a *loraActivity) done() {
	if a == nil {
		return
	}
	a.l.mu.Lock()
	st := a.l.stats[a.name]
	if a.running {
		st.running--
	} else {
		st.waiting--
	}
	a.l.mu.Unlock()
}

// loadRequest is vLLM's LoadLoRAAdapterRequest.
type loadRequest struct {
	LoRAName    string `json:"lora_name"`
	LoRAPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

// unloadRequest is vLLM's UnloadLoRAAdapterRequest.
type unloadRequest struct {
	LoRAName  string `json:"lora_name"`
	LoRAIntID *int   `json:"lora_int_id"`
}

func invalidInput(w http.ResponseWriter, msg string) {
	writeError(w, vllm.NewError(http.StatusBadRequest, vllm.ErrTypeInvalidInput, msg))
}

// handleLoadLoRA is POST /v1/load_lora_adapter with vLLM's codes and
// bodies (vllm/entrypoints/serve/lora/api_router.py): 200 and a plain-text line, 400 for a missing
// field or a name already loaded, 404 for a path with no adapter, 500 for
// any other failure (LoRA not enabled, no free slot).
func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req loadRequest
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if req.LoRAName == "" || req.LoRAPath == "" {
		invalidInput(w, "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	l := s.lora
	name := req.LoRAName
	internal := func(msg string) {
		writeError(w, vllm.NewError(http.StatusInternalServerError, vllm.ErrTypeInternalServer, msg))
	}
	if !l.enabled {
		internal("LoRA is not enabled. Use --enable-lora to enable LoRA.")
		return
	}
	l.mu.Lock()
	a := l.adapters[name]
	switch {
	case a != nil && !req.LoadInplace:
		l.mu.Unlock()
		invalidInput(w, fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name))
		return
	case a != nil && a.loading:
		l.mu.Unlock()
		internal(fmt.Sprintf("Loading lora %s failed: a load of it is already in progress", name))
		return
	case a == nil && len(l.adapters) >= l.max:
		n := len(l.adapters)
		l.mu.Unlock()
		internal(fmt.Sprintf("Loading lora %s failed: %d adapters are held and --max-loras is %d; unload one first", name, n, l.max))
		return
	}
	inplace := a != nil
	if !inplace {
		l.nextID++
		a = &loraAdapter{name: name, path: req.LoRAPath, parent: l.base, id: l.nextID, loading: true}
		l.adapters[name] = a
		l.highMark = max(l.highMark, len(l.adapters))
	}
	l.mu.Unlock()

	err := s.clock.Sleep(r.Context(), s.cfg.LoRALoadDelay)
	if err == nil {
		err = checkAdapterPath(req.LoRAPath)
	}
	l.mu.Lock()
	if err != nil {
		if !inplace && l.adapters[name] == a {
			delete(l.adapters, name)
		}
		l.mu.Unlock()
		if r.Context().Err() == nil {
			s.log.Warn("lora adapter load failed", "adapter", name, "err", err)
			writeError(w, vllm.NewError(http.StatusNotFound, vllm.ErrTypeNotFound, fmt.Sprintf("Loading lora %s failed: %v", name, err)))
		}
		return
	}
	a.loading, a.path = false, req.LoRAPath
	l.statsLocked(name, req.LoRAPath).loads++
	l.mu.Unlock()
	s.log.Info("lora adapter loaded", "adapter", name, "path", req.LoRAPath, "lora_id", a.id)
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", name)
}

// handleUnloadLoRA is POST /v1/unload_lora_adapter: like vLLM, it only
// forgets the name; requests already running on the adapter finish.
func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req unloadRequest
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if req.LoRAName == "" {
		invalidInput(w, "'lora_name' needs to be provided to unload a LoRA adapter.")
		return
	}
	l := s.lora
	l.mu.Lock()
	a := l.adapters[req.LoRAName]
	if a == nil || a.loading {
		l.mu.Unlock()
		writeError(w, vllm.NewError(http.StatusNotFound, vllm.ErrTypeNotFound,
			fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName)))
		return
	}
	delete(l.adapters, req.LoRAName)
	st := l.statsLocked(req.LoRAName, "")
	st.unloads++
	if st.running+st.waiting > 0 {
		st.busyUnloads++
	}
	l.mu.Unlock()
	s.log.Info("lora adapter unloaded", "adapter", req.LoRAName)
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.LoRAName)
}

// adapterCards are the /v1/models cards of the loaded adapters, after the
// base model's, in load order (by id) as vLLM lists them.
func (s *Server) adapterCards() []vllm.ModelCard {
	l := s.lora
	l.mu.Lock()
	var ads []loraAdapter
	for _, a := range l.adapters {
		if !a.loading {
			ads = append(ads, *a)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(ads, func(a, b loraAdapter) int { return a.id - b.id })
	cards := make([]vllm.ModelCard, 0, len(ads))
	for _, a := range ads {
		parent := a.parent
		cards = append(cards, vllm.ModelCard{ID: a.name, Object: "model", Created: s.clock.Now().Unix(), OwnedBy: "vllm",
			Root: a.path, Parent: &parent,
			Permission: []vllm.ModelPermission{{
				ID: "modelperm-" + s.newID(), Object: "model_permission", Created: s.clock.Now().Unix(),
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}}})
	}
	return cards
}

// AdapterInfo is one adapter as GET /sim/adapters reports it: for tests,
// which read what the engine holds and how often each was loaded.
type AdapterInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// State is "loaded", "loading" or "unloaded".
	State   string `json:"state"`
	ID      int    `json:"lora_id,omitempty"`
	Loads   int    `json:"loads"`
	Unloads int    `json:"unloads"`
	// BusyUnloads counts the unloads made while requests for it ran or
	// waited here.
	BusyUnloads int `json:"busy_unloads"`
	Running     int `json:"running"`
	Waiting     int `json:"waiting"`
}

// AdaptersReport is the body of GET /sim/adapters.
type AdaptersReport struct {
	MaxLoRAs int `json:"max_loras"`
	// Held counts loaded and loading adapters now; MaxHeld the most ever
	// held at once, so a test can check a bound over a whole run.
	Held     int           `json:"held"`
	MaxHeld  int           `json:"max_held"`
	Adapters []AdapterInfo `json:"adapters"`
}

func (l *loraSet) report() AdaptersReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	rep := AdaptersReport{MaxLoRAs: l.max, Held: len(l.adapters), MaxHeld: l.highMark, Adapters: []AdapterInfo{}}
	for name, st := range l.stats {
		ai := AdapterInfo{Name: name, Path: st.path, State: "unloaded", Loads: st.loads, Unloads: st.unloads,
			BusyUnloads: st.busyUnloads, Running: st.running, Waiting: st.waiting}
		if a := l.adapters[name]; a != nil {
			ai.State, ai.ID, ai.Path = "loaded", a.id, a.path
			if a.loading {
				ai.State = "loading"
			}
		}
		rep.Adapters = append(rep.Adapters, ai)
	}
	for name, a := range l.adapters {
		if l.stats[name] == nil {
			rep.Adapters = append(rep.Adapters, AdapterInfo{Name: name, Path: a.path, State: "loading", ID: a.id})
		}
	}
	slices.SortFunc(rep.Adapters, func(a, b AdapterInfo) int { return strings.Compare(a.Name, b.Name) })
	return rep
}

func (s *Server) handleAdapters(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.lora.report())
}

// loraInfo is vllm:lora_requests_info: no model_name or engine label, the
// adapters with running and waiting requests as comma-joined label values,
// and the current time as the value. Like vLLM's labelled gauge, a label
// combination once shown stays exposed with the time it was last current.
type loraInfo struct {
	l    *loraSet
	desc *prometheus.Desc
}

func newLoRAInfo(l *loraSet) *loraInfo {
	return &loraInfo{l: l, desc: prometheus.NewDesc(vllm.MetricLoRARequestsInfo, "Running stats on lora requests.",
		[]string{vllm.LabelMaxLoRA, vllm.LabelWaitingLoRAAdapters, vllm.LabelRunningLoRAAdapters}, nil)}
}

func (c *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *loraInfo) Collect(ch chan<- prometheus.Metric) {
	l := c.l
	l.mu.Lock()
	var running, waiting []string
	for name, st := range l.stats {
		if st.running > 0 {
			running = append(running, name)
		}
		if st.waiting > 0 {
			waiting = append(waiting, name)
		}
	}
	slices.Sort(running)
	slices.Sort(waiting)
	key := loraInfoKey{running: strings.Join(running, ","), waiting: strings.Join(waiting, ",")}
	switch {
	case l.frozen != nil:
		key = *l.frozen
	case l.freeze && key != (loraInfoKey{}):
		l.frozen = &key
	}
	l.info[key] = l.now()
	for len(l.info) > maxLoRAInfoSeries {
		oldest, first := loraInfoKey{}, true
		for k, t := range l.info {
			if first || t < l.info[oldest] {
				oldest, first = k, false
			}
		}
		delete(l.info, oldest)
	}
	maxLoRA := strconv.Itoa(l.max)
	for k, t := range l.info {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, t, maxLoRA, k.waiting, k.running)
	}
	l.mu.Unlock()
}

// loraName is the adapter a request's model names, or "" for the base
// model (checkModel has accepted the name already).
func (s *Server) loraName(model string) string {
	if _, ok := s.lora.lookup(model); ok {
		return model
	}
	return ""
}

// setLoRA tags the blocks the sequence will store with its adapter.
func (s *sequence) setLoRA(name string, id int) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	s.a.loraName, s.a.loraID = name, id
}
