package flow

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Class is one priority class. Classes are listed highest first: a
// request of a class is dispatched only while no request of a higher class
// waits here, or has waited at another router as it last reported.
type Class struct {
	Name string `yaml:"name"`
	// TTL is how long a request of the class may wait in the queue; then
	// it is refused with 429 queue_timeout. A request is never dropped
	// before it.
	TTL time.Duration `yaml:"ttl"`
	// MaxQueued and MaxQueuedBytes bound one model's queue of the class,
	// per router: a request that would pass either is refused at once
	// (429 queue_full, queue_bytes).
	MaxQueued      int   `yaml:"max_queued"`
	MaxQueuedBytes int64 `yaml:"max_queued_bytes"`
	// Headroom is the share of the model's capacity the class leaves free
	// for the classes above it: it is dispatched only while more than
	// headroom × capacity (rounded down to whole requests) is free. What keeps a higher class from waiting
	// at all, and what bounds inversions between routers (design §7.8).
	Headroom float64 `yaml:"headroom"`
}

// Config configures flow control (design §7.8).
type Config struct {
	// Enabled turns flow control on. Off, every request is dispatched at
	// once, as before flow control existed.
	Enabled bool `yaml:"enabled"`
	// ReplicaConcurrency is the requests one replica serves before it
	// counts as full: the router's concurrency target, the batch size past
	// which time to first token grows more than throughput. 0: a replica
	// is full only by its engine's own signals (MaxWaiting, KVCeiling).
	ReplicaConcurrency int `yaml:"replica_concurrency"`
	// MaxWaiting is the engine's waiting queue at which a replica is full;
	// with ReplicaConcurrency 0, also what a replica has room for.
	MaxWaiting int `yaml:"max_waiting"`
	// KVCeiling is the KV-cache use at which a replica is full.
	KVCeiling float64 `yaml:"kv_ceiling"`
	// Classes, highest first; DefaultClass is the class of a request whose
	// tenant names none.
	Classes      []Class `yaml:"classes"`
	DefaultClass string  `yaml:"default_class"`
	// HalfLife is how fast a tenant's attained service decays: the
	// memory of least-attained-service fairness within a class.
	HalfLife time.Duration `yaml:"fairness_half_life"`
	// OutputWeight weighs an output token against an input token in the
	// attained service (decoding costs more GPU time than prefill).
	OutputWeight float64 `yaml:"output_weight"`
	// InversionWait is the wait of a higher class past which dispatching
	// a lower one is counted as an inversion; another router's higher
	// class that has waited half of it holds this router's lower classes.
	InversionWait time.Duration `yaml:"inversion_wait"`
	// Tick is how often the queue is looked at while requests wait: the
	// engines' load arrives every 50 ms, completions wake it at once.
	Tick time.Duration `yaml:"tick"`
	// ReportInterval is how often the router tells the control plane its
	// queues (and hears the other routers').
	ReportInterval time.Duration `yaml:"report_interval"`
}

// DefaultConfig is on, with three classes — interactive, standard (the default),
// batch — and a replica full when its engine queues or its KV cache is
// 95 % used.
func DefaultConfig() Config {
	return Config{
		Enabled:    true,
		MaxWaiting: 1,
		KVCeiling:  0.95,
		Classes: []Class{
			{Name: "interactive", TTL: 30 * time.Second, MaxQueued: 1000, MaxQueuedBytes: 64 << 20},
			{Name: "standard", TTL: 60 * time.Second, MaxQueued: 1000, MaxQueuedBytes: 64 << 20, Headroom: 0.05},
			{Name: "batch", TTL: 5 * time.Minute, MaxQueued: 5000, MaxQueuedBytes: 256 << 20, Headroom: 0.10},
		},
		DefaultClass:   "standard",
		HalfLife:       time.Minute,
		OutputWeight:   2,
		InversionWait:  100 * time.Millisecond,
		Tick:           10 * time.Millisecond,
		ReportInterval: 250 * time.Millisecond,
	}
}

// MaxClasses bounds the classes: each is a label value on every flow
// series of every model.
const MaxClasses = 8

// className is the syntax the control plane checks a tenant's classes
// against (fsm); a class the routers configure must be nameable there.
var className = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// filled is c with what a class leaves out given: a class listed by name
// alone gets a minute's TTL and DefaultConfig's standard bounds.
func (c Config) filled() Config {
	cls := make([]Class, len(c.Classes))
	for i, cl := range c.Classes {
		if cl.TTL == 0 {
			cl.TTL = time.Minute
		}
		if cl.MaxQueued == 0 {
			cl.MaxQueued = 1000
		}
		if cl.MaxQueuedBytes == 0 {
			cl.MaxQueuedBytes = 64 << 20
		}
		cls[i] = cl
	}
	c.Classes = cls
	return c
}

// Validate reports every problem, each naming the key as written in the
// router's config file. A class's ttl, max_queued and max_queued_bytes
// left out (0) take their defaults.
func (c Config) Validate() error {
	c = c.filled()
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("flow.%s: "+format, append([]any{key}, a...)...))
	}
	if c.ReplicaConcurrency < 0 {
		bad("replica_concurrency", "must not be negative, got %d", c.ReplicaConcurrency)
	}
	if c.MaxWaiting < 1 {
		bad("max_waiting", "must be at least 1, got %d", c.MaxWaiting)
	}
	if !(c.KVCeiling > 0 && c.KVCeiling <= 1) {
		bad("kv_ceiling", "must be in (0, 1], got %g", c.KVCeiling)
	}
	if len(c.Classes) == 0 || len(c.Classes) > MaxClasses {
		bad("classes", "must list 1 to %d classes, got %d", MaxClasses, len(c.Classes))
	}
	seen := map[string]bool{}
	for i, cl := range c.Classes {
		key := fmt.Sprintf("classes[%d]", i)
		if !className.MatchString(cl.Name) {
			bad(key, "name %q: lowercase letters, digits, '-' and '_', starting with a letter, at most 32 bytes", cl.Name)
		}
		if seen[cl.Name] {
			bad(key, "name %q is listed twice", cl.Name)
		}
		seen[cl.Name] = true
		if cl.TTL <= 0 {
			bad(key, "ttl must be positive, got %s", cl.TTL)
		}
		if cl.MaxQueued < 1 {
			bad(key, "max_queued must be at least 1, got %d", cl.MaxQueued)
		}
		if cl.MaxQueuedBytes < 1 {
			bad(key, "max_queued_bytes must be at least 1, got %d", cl.MaxQueuedBytes)
		}
		if !(cl.Headroom >= 0 && cl.Headroom < 1) {
			bad(key, "headroom must be in [0, 1), got %g", cl.Headroom)
		}
		if i > 0 && cl.Headroom < c.Classes[i-1].Headroom {
			bad(key, "headroom %g is below the class above's %g: a lower class would take what a higher one may not", cl.Headroom, c.Classes[i-1].Headroom)
		}
	}
	if !seen[c.DefaultClass] {
		bad("default_class", "%q is not one of flow.classes", c.DefaultClass)
	}
	if c.HalfLife <= 0 {
		bad("fairness_half_life", "must be positive, got %s", c.HalfLife)
	}
	if !(c.OutputWeight >= 0) {
		bad("output_weight", "must not be negative, got %g", c.OutputWeight)
	}
	if c.InversionWait <= 0 {
		bad("inversion_wait", "must be positive, got %s", c.InversionWait)
	}
	if c.Tick <= 0 {
		bad("tick", "must be positive, got %s", c.Tick)
	}
	if c.ReportInterval <= 0 {
		bad("report_interval", "must be positive, got %s", c.ReportInterval)
	}
	return errors.Join(errs...)
}
