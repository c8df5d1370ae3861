package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"
)

// result is what the run prints.
type result struct {
	Started    string         `json:"started"`
	Config     publicConfig   `json:"config"`
	LoadBefore string         `json:"load_before"`
	LoadAfter  string         `json:"load_after"`
	Fleets     []*fleetResult `json:"fleets"`
}

// publicConfig is the config as JSON shows it.
type publicConfig struct {
	ReplicasPerAgent int       `json:"replicas_per_agent"`
	BlocksPerReplica int       `json:"blocks_per_replica"`
	Rates            []float64 `json:"rates"`
	Routers          int       `json:"routers"`
	AddRouters       int       `json:"add_routers"`
	FanoutRate       float64   `json:"fanout_rate"`
	Flush            string    `json:"flush"`
	Window           string    `json:"window"`
	ProbeInterval    string    `json:"probe_interval"`
	LagLimit         string    `json:"lag_limit"`
}

func (c config) public() publicConfig {
	return publicConfig{ReplicasPerAgent: c.perAgent, BlocksPerReplica: c.blocks, Rates: c.rates, Routers: c.routers,
		AddRouters: c.addRouters, FanoutRate: c.fanoutRate, Flush: c.flush.String(), Window: c.window.String(),
		ProbeInterval: c.probeInterval.String(), LagLimit: c.lagLimit.String()}
}

// fleetResult is one fleet size's figures.
type fleetResult struct {
	Replicas         int     `json:"replicas"`
	Agents           int     `json:"agents"`
	ReplicasPerAgent int     `json:"replicas_per_agent"`
	BlocksPerReplica int     `json:"blocks_per_replica"`
	Entries          int     `json:"entries"`
	Routers          int     `json:"routers"`
	PlaceSeconds     float64 `json:"place_seconds"`
	// RegisterSeconds is the agents' start to every node registered (a
	// part of PlaceSeconds); ApplyToPlacedSeconds the model's apply to the
	// last agent's desired set holding its replicas.
	// ApplyToCommittedSeconds is the apply to the last replica's commit,
	// as the leader's watch saw it (commits.go).
	RegisterSeconds         float64     `json:"register_seconds"`
	ApplyToCommittedSeconds float64     `json:"apply_to_committed_seconds"`
	ApplyToPlacedSeconds    float64     `json:"apply_to_placed_seconds"`
	ScaleSteps              []scaleStep `json:"scale_steps,omitempty"`
	FirstIndexSeconds       float64     `json:"first_index_seconds"`

	// Per replica: the loaded, idle fleet against the servers before any
	// agent attached, both after a GC (mean of the 3 servers); the idle
	// CPU is the idle point's.
	ControlRSSPerReplicaKB  float64 `json:"control_rss_per_replica_kb"`
	ControlHeapPerReplicaKB float64 `json:"control_heap_per_replica_kb"`
	ControlCoresPerKReplica float64 `json:"control_cores_per_1k_replicas_idle"`
	// Router memory per million (block, replica) entries: the loaded
	// index against the empty one, both after a GC (mean of the first
	// routers).
	RouterRSSPerMEntriesMB  float64 `json:"router_rss_per_m_entries_mb"`
	RouterHeapPerMEntriesMB float64 `json:"router_heap_per_m_entries_mb"`

	// CaughtUp: after the sweep, at rate 0, every router's index held the
	// exact fleet again (after CatchUpSeconds), without a restart.
	CaughtUp       bool    `json:"caught_up"`
	CatchUpSeconds float64 `json:"catch_up_seconds"`

	Idle   *point       `json:"idle"`
	Points []*point     `json:"points"`
	Fanout []fanoutStep `json:"fanout"`
}

// point is one measured window.
type point struct {
	Rate         float64 `json:"rate"`
	SentRate     float64 `json:"sent_rate"`
	LagFromEvent summary `json:"lag_from_event"`
	LagFromSend  summary `json:"lag_from_send"`
	// RouterLagP99 is each router's own event-to-index p99.
	RouterLagP99 []float64 `json:"router_lag_p99_ms"`
	Probes       int       `json:"probes"`
	Lost         int       `json:"lost"`
	// Skipped: probes not made while maxInflightProbes travelled.
	Skipped int `json:"skipped"`
	// Cores: CPU seconds per second over the window.
	ControlCores    float64 `json:"control_cores"`
	ControlCoresMax float64 `json:"control_cores_max"`
	// ControlCoresPerKEvents is (control cores − idle) per 1 k events/s.
	ControlCoresPerKEvents float64 `json:"control_cores_per_1k_events"`
	RouterCores            float64 `json:"router_cores"`
	// RouterUpdatesPerSec is the ephemeral updates each router received
	// per second (mean over the routers): the count that drives the
	// per-update costs, whatever the events per update.
	RouterUpdatesPerSec float64     `json:"router_updates_per_sec"`
	HarnessCores        float64     `json:"harness_cores"`
	Servers             []procUsage `json:"servers"`
	Routers             []procUsage `json:"routers"`
	// Signals over the window (sums of counter deltas).
	WatchOverflows   float64 `json:"watch_overflows"`
	RouterReconnects float64 `json:"router_reconnects"`
	Gaps             float64 `json:"gaps"`
	FullCopyRequests float64 `json:"full_copy_requests"`
	SessionsCut      float64 `json:"sessions_cut"`
	AgentSessions    int64   `json:"agent_sessions_opened"`
	EntriesOK        bool    `json:"router_entries_exact"`
	LoadAvg          string  `json:"load_avg"`
}

// scaleStep is one change of the model's count by one replica, timed at
// the agents: from the start of the apply call to the first and the last
// change of an agent's desired set that followed.
type scaleStep struct {
	Kind string `json:"kind"` // "down" (one fewer) or "up" (back)
	// Live: the agents were reporting at each flush (--scale-rate).
	Live bool `json:"live,omitempty"`
	// ApplyMs is the ApplyModel call: the decision's own commit.
	ApplyMs float64 `json:"apply_ms"`
	// CommitFirstMs is to placement's first decision committed, as the
	// leader's watch saw it (down: the replica draining; up: the new
	// replica); CommitDoneMs to its last (down: the drained replica
	// removed). FirstMs and DoneMs are the same at the agents: the first
	// and last change of a desired set.
	CommitFirstMs float64 `json:"commit_first_ms"`
	CommitDoneMs  float64 `json:"commit_done_ms"`
	FirstMs       float64 `json:"agent_first_ms"`
	DoneMs        float64 `json:"agent_done_ms"`
}

// procUsage is one process over a window.
type procUsage struct {
	Cores  float64 `json:"cores"`
	RSSMB  float64 `json:"rss_mb"`
	HeapMB float64 `json:"heap_mb"`
}

// fanoutStep is the fleet with one more router.
type fanoutStep struct {
	Routers      int     `json:"routers"`
	ControlCores float64 `json:"control_cores"`
	DeltaCores   float64 `json:"delta_cores"`
	LagFromEvent summary `json:"lag_from_event"`
	// RouterLagP99 and RouterCores are each router's, the new one last.
	RouterLagP99    []float64 `json:"router_lag_p99_ms"`
	RouterCores     []float64 `json:"router_cores"`
	ReadySeconds    float64   `json:"ready_seconds,omitempty"`
	FullCopySeconds float64   `json:"full_copy_seconds,omitempty"`
	NewRouterRSSMB  float64   `json:"new_router_rss_mb,omitempty"`
	NewRouterHeapMB float64   `json:"new_router_heap_mb,omitempty"`
}

func cores(a, b usage) float64 {
	d := b.at.Sub(a.at).Seconds()
	if d <= 0 {
		return 0
	}
	return round3((b.cpu - a.cpu).Seconds() / d)
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

const mb = 1 << 20

// newPoint computes a window's figures from its two snapshots and probes;
// a lost probe counts at the timeout.
func newPoint(rate float64, a, b snap, samples []lagSample, timeout time.Duration) *point {
	p := &point{Rate: rate, Probes: len(samples), AgentSessions: b.sessions - a.sessions}
	if d := b.at.Sub(a.at).Seconds(); d > 0 {
		p.SentRate = math.Round(float64(b.events-a.events) / d)
		p.HarnessCores = round3((b.self - a.self).Seconds() / d)
	}
	for i := range b.servers {
		c := cores(a.servers[i], b.servers[i])
		p.ControlCores += c
		p.ControlCoresMax = max(p.ControlCoresMax, c)
		p.Servers = append(p.Servers, procUsage{Cores: c, RSSMB: round3(float64(b.servers[i].rss) / mb), HeapMB: round3(b.servers[i].heap / mb)})
	}
	p.ControlCores = round3(p.ControlCores)
	for i := range b.routers {
		c := cores(a.routers[i], b.routers[i])
		p.RouterCores += c
		p.Routers = append(p.Routers, procUsage{Cores: c, RSSMB: round3(float64(b.routers[i].rss) / mb), HeapMB: round3(b.routers[i].heap / mb)})
	}
	p.RouterCores = round3(p.RouterCores)
	if d := b.at.Sub(a.at).Seconds(); d > 0 && len(b.routers) > 0 {
		var n float64
		for i := range b.routers {
			n += b.routers[i].metrics[routerEphemeral] - a.routers[i].metrics[routerEphemeral]
		}
		p.RouterUpdatesPerSec = math.Round(n / float64(len(b.routers)) / d)
	}
	delta := func(us [][2]usage, name string) float64 {
		var s float64
		for _, u := range us {
			s += u[1].metrics[name] - u[0].metrics[name]
		}
		return s
	}
	var all [][2]usage
	for i := range b.servers {
		all = append(all, [2]usage{a.servers[i], b.servers[i]})
	}
	for i := range b.routers {
		all = append(all, [2]usage{a.routers[i], b.routers[i]})
	}
	p.WatchOverflows = delta(all, "llmgw_control_watch_overflows_total")
	p.RouterReconnects = delta(all, "llmgw_router_watch_reconnects_total")
	p.Gaps = delta(all, "llmgw_control_ephemeral_gaps_total")
	p.FullCopyRequests = delta(all, "llmgw_control_ephemeral_full_copy_requests_total")
	p.SessionsCut = delta(all, "llmgw_control_agent_sessions_cut_total")

	var fromEvent, fromSend []time.Duration
	perRouter := make([][]time.Duration, len(b.routers))
	for _, s := range samples {
		if s.lost {
			p.Lost++
			fromEvent, fromSend = append(fromEvent, timeout), append(fromSend, timeout)
		} else {
			fromEvent, fromSend = append(fromEvent, s.fromEvent), append(fromSend, s.fromSend)
		}
		for i, d := range s.perRouter {
			if i < len(perRouter) {
				if d == 0 {
					d = timeout
				}
				perRouter[i] = append(perRouter[i], d)
			}
		}
	}
	p.LagFromEvent, p.LagFromSend = summarize(fromEvent), summarize(fromSend)
	for _, r := range perRouter {
		p.RouterLagP99 = append(p.RouterLagP99, summarize(r).P99)
	}
	return p
}

// perKEvents sets the control cost per 1 k events/s above idle.
func (p *point) perKEvents(idle *point) {
	if p.SentRate > 0 {
		p.ControlCoresPerKEvents = round3((p.ControlCores - idle.ControlCores) / (p.SentRate / 1000))
	}
}

// derive sets the per-replica and per-entry figures from two settled
// snapshots: the servers and routers before any agent attached (base) and
// the loaded, idle fleet.
func (f *fleetResult) derive(base, loaded snap) {
	var rss, heap float64
	for i := range loaded.servers {
		rss += float64(loaded.servers[i].rss - base.servers[i].rss)
		heap += loaded.servers[i].heap - base.servers[i].heap
	}
	n := float64(len(loaded.servers))
	f.ControlRSSPerReplicaKB = round3(rss / n / float64(f.Replicas) / 1024)
	f.ControlHeapPerReplicaKB = round3(heap / n / float64(f.Replicas) / 1024)
	if f.Idle != nil {
		f.ControlCoresPerKReplica = round3(f.Idle.ControlCores / float64(f.Replicas) * 1000)
	}
	rss, heap = 0, 0
	for i := range base.routers {
		rss += float64(loaded.routers[i].rss - base.routers[i].rss)
		heap += loaded.routers[i].heap - base.routers[i].heap
	}
	m := float64(len(base.routers)) * float64(f.Entries) / 1e6
	f.RouterRSSPerMEntriesMB = round3(rss / m / mb)
	f.RouterHeapPerMEntriesMB = round3(heap / m / mb)
}

func (r *result) print(w io.Writer, asJSON bool) {
	if asJSON {
		out, _ := json.MarshalIndent(r, "", "  ")
		fmt.Fprintln(w, string(out))
		return
	}
	fmt.Fprintf(w, "fleetsim %s, load before %s, after %s; %d replicas/agent, %d blocks/replica, flush %s, window %s\n",
		r.Started, r.LoadBefore, r.LoadAfter, r.Config.ReplicasPerAgent, r.Config.BlocksPerReplica, r.Config.Flush, r.Config.Window)
	for _, f := range r.Fleets {
		fmt.Fprintf(w, "\n%d replicas (%d agents), %d entries, %d routers; placed in %.1f s, routers' index full %.1f s later\n",
			f.Replicas, f.Agents, f.Entries, f.Routers, f.PlaceSeconds, f.FirstIndexSeconds)
		fmt.Fprintf(w, "nodes registered in %.1f s; apply → every replica committed %.2f s, in its agent's desired set %.2f s\n",
			f.RegisterSeconds, f.ApplyToCommittedSeconds, f.ApplyToPlacedSeconds)
		for _, st := range f.ScaleSteps {
			live := "idle"
			if st.Live {
				live = "live"
			}
			fmt.Fprintf(w, "scale %-4s (%s) apply %.1f ms; placement committed: first %.1f ms, done %.1f ms; at the agent: first %.1f ms, done %.1f ms\n",
				st.Kind, live, st.ApplyMs, st.CommitFirstMs, st.CommitDoneMs, st.FirstMs, st.DoneMs)
		}
		if f.Idle == nil {
			continue // --place-only
		}
		fmt.Fprintf(w, "control per replica: RSS %.1f KiB, heap %.1f KiB, idle CPU ÷ replicas %.4f cores per 1k; router per 1 M entries: RSS %.1f MiB, heap %.1f MiB\n",
			f.ControlRSSPerReplicaKB, f.ControlHeapPerReplicaKB, f.ControlCoresPerKReplica, f.RouterRSSPerMEntriesMB, f.RouterHeapPerMEntriesMB)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RATE\tSENT/s\tLAG EVENT p50/p99 ms\tLAG SEND p50/p99 ms\tPROBES(lost)\tCONTROL cores (max)\tper 1k ev/s\tCONTROL RSS MB\tROUTER cores\tHARNESS cores\tOVERFLOW/RECONN/GAPS\tEXACT\tLOAD")
		rows := append([]*point{f.Idle}, f.Points...)
		for _, p := range rows {
			if p == nil {
				continue
			}
			var rss float64
			for _, s := range p.Servers {
				rss = max(rss, s.RSSMB)
			}
			fmt.Fprintf(tw, "%g\t%g\t%.0f / %.0f\t%.0f / %.0f\t%d(%d)\t%.2f (%.2f)\t%.4f\t%.0f\t%.2f\t%.2f\t%g/%g/%g\t%t\t%s\n",
				p.Rate, p.SentRate, p.LagFromEvent.P50, p.LagFromEvent.P99, p.LagFromSend.P50, p.LagFromSend.P99, p.Probes, p.Lost,
				p.ControlCores, p.ControlCoresMax, p.ControlCoresPerKEvents, rss, p.RouterCores, p.HarnessCores,
				p.WatchOverflows, p.RouterReconnects, p.Gaps, p.EntriesOK, p.LoadAvg)
		}
		tw.Flush()
		if len(f.Fanout) > 0 {
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ROUTERS\tCONTROL cores\tΔ cores\tLAG EVENT p99 ms\tNEW ROUTER ready s\tfull copy s\tRSS MB\theap MB")
			for _, s := range f.Fanout {
				fmt.Fprintf(tw, "%d\t%.2f\t%+.3f\t%.0f\t%.2f\t%.2f\t%.0f\t%.0f\n", s.Routers, s.ControlCores, s.DeltaCores, s.LagFromEvent.P99,
					s.ReadySeconds, s.FullCopySeconds, s.NewRouterRSSMB, s.NewRouterHeapMB)
			}
			tw.Flush()
		}
	}
}
