package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/configfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// modelFile is the YAML an operator writes for `llmgwctl model apply -f`.
// Integers are decoded as int so a negative or huge value gets an error that
// names the field instead of YAML's type complaint; a fraction or an
// exponent (replicas: 1.5, 1e9) is refused by configfile.Strict, where
// yaml.v3 alone would truncate it.
type modelFile struct {
	Name              string            `yaml:"name"`
	Engine            string            `yaml:"engine"`
	Model             string            `yaml:"model"`
	ExtraArgs         []string          `yaml:"extra_args"`
	Replicas          *int              `yaml:"replicas"`
	GPUsPerReplica    *int              `yaml:"gpus_per_replica"`
	NodeSelector      map[string]string `yaml:"node_selector"`
	Profile           string            `yaml:"profile"`
	ProfileOverrides  *overridesFile    `yaml:"profile_overrides"`
	KVEvents          bool              `yaml:"kv_events"`
	BlockSize         int               `yaml:"block_size"`
	HashSeed          string            `yaml:"hash_seed"`
	Adapters          []adapterFile     `yaml:"adapters"`
	MaxLoadedAdapters int               `yaml:"max_loaded_adapters"`
	MaxLoRARank       int               `yaml:"max_lora_rank"`
	Task              string            `yaml:"task"`
	Endpoints         []string          `yaml:"endpoints"`
	// For engine external with kv_events: each endpoint's KV-event
	// publisher and replay socket, by index, and their topic.
	KVEventsPublishers []string `yaml:"kv_events_publishers"`
	KVEventsReplay     []string `yaml:"kv_events_replay"`
	KVEventsTopic      string   `yaml:"kv_events_topic"`
	// Instead of publishers: what the owning agent binds for engines
	// whose publishers connect out, and who may connect to it.
	KVEventsListen []string `yaml:"kv_events_listen"`
	KVEventsAllow  []string `yaml:"kv_events_allow"`
	// The engines' replay buffer size (vLLM's buffer_steps).
	KVEventsBufferSteps int `yaml:"kv_events_buffer_steps"`
	// The model policy's explicit permissions (fsm.ValidateModel says what
	// each allows); both default to false.
	AllowRemoteCode         bool `yaml:"allow_remote_code"`
	AllowLinkLocalEndpoints bool `yaml:"allow_link_local_endpoints"`
	// Elastic capacity (design §5.7): the count follows the load within
	// autoscale's bounds; priority and pinned say who gives a GPU up.
	Autoscale *autoscaleFile `yaml:"autoscale"`
	Priority  int            `yaml:"priority"`
	Pinned    bool           `yaml:"pinned"`
}

// autoscaleFile is a model file's autoscale section; durations as Go
// writes them (500ms, 30s, 5m).
type autoscaleFile struct {
	Min             int           `yaml:"min"`
	Max             int           `yaml:"max"`
	TargetWaiting   float64       `yaml:"target_waiting"`
	TargetKVUsage   float64       `yaml:"target_kv_usage"`
	TTFTP90SLO      time.Duration `yaml:"ttft_p90_slo"`
	ScaleDownAfter  time.Duration `yaml:"scale_down_after"`
	Cooldown        time.Duration `yaml:"cooldown"`
	HoldTimeout     time.Duration `yaml:"hold_timeout"`
	MaxHeld         int           `yaml:"max_held"`
	WarmConcurrency int           `yaml:"warm_concurrency"`
	Sleep           bool          `yaml:"sleep"`
}

type overridesFile struct {
	TargetWaiting     float64            `yaml:"target_waiting"`
	TargetInflight    float64            `yaml:"target_inflight"`
	KVCeiling         float64            `yaml:"kv_ceiling"`
	SessionLoadFactor float64            `yaml:"session_load_factor"`
	Weights           map[string]float64 `yaml:"weights"`
	Picker            string             `yaml:"picker"`
	KVScore           string             `yaml:"kv_score"`
	Speculation       *bool              `yaml:"speculation"`
	KVQueueWeight     float64            `yaml:"kv_queue_weight"`
	KVAffinity        *bool              `yaml:"kv_affinity"`
}

type adapterFile struct {
	Name string `yaml:"name"`
	Path string `yaml:"path"`
}

// parseModelFile decodes one model strictly (an unknown key is an error, as
// is a second document, a value of the wrong type or a fraction where a
// count belongs, each named by its key: configfile.Strict), fills the
// defaults and validates it with the same pure code the control plane runs,
// so a bad file is refused before anything is written. It reports every
// problem it finds at once, one per line, each naming the key and its line
// ("replicas: line 4: -2 is out of range"), as the servers' configuration
// files do; the control plane's validation stops at its first refusal, so
// that one is reported once the values decode.
func parseModelFile(r io.Reader) (*llmgwv1.Model, error) {
	data, err := io.ReadAll(io.LimitReader(r, configfile.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read model file: %w", err)
	}
	if len(data) > configfile.MaxSize {
		return nil, fmt.Errorf("model file: larger than %d bytes", configfile.MaxSize)
	}
	var f modelFile
	var p configfile.Problems
	switch err := configfile.Strict(data, &f); {
	case errors.Is(err, configfile.ErrEmpty):
		return nil, errors.New("model file is empty")
	case errors.Is(err, configfile.ErrSecondDocument):
		return nil, errors.New("model file: holds more than one document; apply one model per file")
	case err != nil:
		// Each line is one problem that names its key; the values that
		// did decode are still checked below, so every problem shows.
		p.Join(err)
	}
	m, convErr := f.toProto()
	p.Join(convErr)
	if convErr == nil && p.Err() == nil {
		// Only a file whose every value decoded: a key refused above reads
		// as its zero value here, and validation would blame it twice.
		m = fsm.ModelDefaults(m)
		p.Join(fsm.ValidateModel(m))
	}
	if err := p.Err(); err != nil {
		return nil, withLines(err, configfile.KeyLines(data))
	}
	return m, nil
}

// withLines puts the line of its key into each problem of err (one per
// line, "<key>: <message>") that does not say it yet, so an operator finds
// every problem in the file.
func withLines(err error, lines map[string]int) error {
	problems := strings.Split(err.Error(), "\n")
	for i, pr := range problems {
		key, msg, ok := strings.Cut(pr, ": ")
		if !ok || strings.HasPrefix(msg, "line ") {
			continue
		}
		if line, ok := lines[key]; ok {
			problems[i] = fmt.Sprintf("%s: line %d: %s", key, line, msg)
		}
	}
	msg := problems[0]
	if len(problems) > 1 {
		// One problem a line, under a count, rather than the first on the
		// line of the command's own words.
		msg = fmt.Sprintf("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return fmt.Errorf("model file: %w", &problemsError{msg: msg, err: err})
}

// problemsError is a model file's problems with their lines, wrapping the
// problems as found (so errors.Is and errors.As still see the causes).
type problemsError struct {
	msg string
	err error
}

func (e *problemsError) Error() string { return e.msg }
func (e *problemsError) Unwrap() error { return e.err }

func (f *modelFile) toProto() (*llmgwv1.Model, error) {
	m := &llmgwv1.Model{
		Name:         f.Name,
		Engine:       f.Engine,
		Model:        f.Model,
		ExtraArgs:    f.ExtraArgs,
		NodeSelector: f.NodeSelector,
		Profile:      f.Profile,
		KvEvents:     f.KVEvents,
		HashSeed:     f.HashSeed,
		Task:         f.Task,
		Endpoints:    f.Endpoints,

		KvEventsPublishers: f.KVEventsPublishers,
		KvEventsReplay:     f.KVEventsReplay,
		KvEventsTopic:      f.KVEventsTopic,
		KvEventsListen:     f.KVEventsListen,
		KvEventsAllow:      f.KVEventsAllow,

		AllowRemoteCode:         f.AllowRemoteCode,
		AllowLinkLocalEndpoints: f.AllowLinkLocalEndpoints,
	}
	// Every value out of range is reported, not only the first.
	var p configfile.Problems
	set := func(field string, v int, dst *uint32) {
		if v < 0 || v > math.MaxUint32 {
			p.Add(field, "%d is out of range (0..%d)", v, uint32(math.MaxUint32))
			return
		}
		*dst = uint32(v)
	}
	// An omitted replica count means one (with autoscale, its min); an
	// explicit 0 is refused by validation rather than silently becoming one.
	replicas := 1
	if f.Autoscale != nil {
		replicas = max(1, f.Autoscale.Min)
	}
	if f.Replicas != nil {
		replicas = *f.Replicas
	}
	set("replicas", replicas, &m.Replicas)
	if f.GPUsPerReplica != nil {
		set("gpus_per_replica", *f.GPUsPerReplica, &m.GpusPerReplica)
	}
	set("block_size", f.BlockSize, &m.BlockSize)
	set("max_loaded_adapters", f.MaxLoadedAdapters, &m.MaxLoadedAdapters)
	set("max_lora_rank", f.MaxLoRARank, &m.MaxLoraRank)
	set("kv_events_buffer_steps", f.KVEventsBufferSteps, &m.KvEventsBufferSteps)
	if a := f.Autoscale; a != nil {
		m.Autoscale = &llmgwv1.Autoscale{TargetWaiting: a.TargetWaiting, TargetKvUsage: a.TargetKVUsage, Sleep: a.Sleep}
		set("autoscale.min", a.Min, &m.Autoscale.Min)
		set("autoscale.max", a.Max, &m.Autoscale.Max)
		set("autoscale.max_held", a.MaxHeld, &m.Autoscale.MaxHeld)
		set("autoscale.warm_concurrency", a.WarmConcurrency, &m.Autoscale.WarmConcurrency)
		for _, d := range []struct {
			key  string
			v    time.Duration
			unit time.Duration
			dst  *uint32
		}{
			{"autoscale.ttft_p90_slo", a.TTFTP90SLO, time.Millisecond, &m.Autoscale.TtftP90SloMs},
			{"autoscale.scale_down_after", a.ScaleDownAfter, time.Second, &m.Autoscale.ScaleDownAfterS},
			{"autoscale.cooldown", a.Cooldown, time.Second, &m.Autoscale.CooldownS},
			{"autoscale.hold_timeout", a.HoldTimeout, time.Second, &m.Autoscale.HoldTimeoutS},
		} {
			if d.v < 0 || d.v%d.unit != 0 {
				p.Add(d.key, "%v must be a whole number of %v and not negative", d.v, d.unit)
				continue
			}
			set(d.key, int(min(d.v/d.unit, math.MaxUint32+1)), d.dst)
		}
	}
	if f.Priority < math.MinInt32 || f.Priority > math.MaxInt32 {
		p.Add("priority", "%d is out of range (%d..%d)", f.Priority, math.MinInt32, math.MaxInt32)
	} else {
		m.Priority = int32(f.Priority)
	}
	m.Pinned = f.Pinned
	if err := p.Err(); err != nil {
		return nil, err
	}
	for _, a := range f.Adapters {
		m.Adapters = append(m.Adapters, &llmgwv1.Adapter{Name: a.Name, Path: a.Path})
	}
	if o := f.ProfileOverrides; o != nil {
		m.ProfileOverrides = &llmgwv1.ProfileOverrides{
			TargetWaiting:     o.TargetWaiting,
			TargetInflight:    o.TargetInflight,
			KvCeiling:         o.KVCeiling,
			SessionLoadFactor: o.SessionLoadFactor,
			Weights:           o.Weights,
			Picker:            o.Picker,
			KvScore:           o.KVScore,
			Speculation:       o.Speculation,
			KvQueueWeight:     o.KVQueueWeight,
			KvAffinity:        o.KVAffinity,
		}
	}
	return m, nil
}
