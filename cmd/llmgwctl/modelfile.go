package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// modelFile is the YAML an operator writes for `llmgwctl model apply -f`.
// Integers are decoded as int so a negative or huge value gets an error that
// names the field instead of YAML's type complaint.
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
	// The model policy's explicit permissions (fsm.ValidateModel says what
	// each allows); both default to false.
	AllowRemoteCode         bool `yaml:"allow_remote_code"`
	AllowLinkLocalEndpoints bool `yaml:"allow_link_local_endpoints"`
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
// is a second document), fills the defaults and validates it with the same
// pure code the control plane runs, so a bad file is refused before anything
// is written and the error names the field.
func parseModelFile(r io.Reader) (*llmgwv1.Model, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read model file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f modelFile
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("model file is empty")
		}
		return nil, fmt.Errorf("model file: %s", nameFields(err, data))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("model file: holds more than one document; apply one model per file")
	}
	m, err := f.toProto()
	if err != nil {
		return nil, err
	}
	m = fsm.ModelDefaults(m)
	if err := fsm.ValidateModel(m); err != nil {
		return nil, err
	}
	return m, nil
}

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

		AllowRemoteCode:         f.AllowRemoteCode,
		AllowLinkLocalEndpoints: f.AllowLinkLocalEndpoints,
	}
	var err error
	set := func(field string, v int, dst *uint32) {
		if err != nil {
			return
		}
		if v < 0 || v > math.MaxUint32 {
			err = fmt.Errorf("%s: %d is out of range (0..%d)", field, v, uint32(math.MaxUint32))
			return
		}
		*dst = uint32(v)
	}
	// An omitted replica count means one; an explicit 0 is refused by
	// validation rather than silently becoming one.
	replicas := 1
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
	if err != nil {
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

// nameFields rewrites YAML's type errors ("line 4: cannot unmarshal !!str
// `two` into int") to lead with the key on that line, so every error an
// operator sees names the field at fault.
func nameFields(err error, data []byte) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	lines := strings.Split(string(data), "\n")
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		var n int
		if _, scanErr := fmt.Sscanf(e, "line %d:", &n); scanErr == nil && n >= 1 && n <= len(lines) {
			key, _, ok := strings.Cut(strings.TrimLeft(lines[n-1], " -"), ":")
			if ok && key != "" {
				e = key + ": " + e
			}
		}
		msgs = append(msgs, e)
	}
	return strings.Join(msgs, "; ")
}
