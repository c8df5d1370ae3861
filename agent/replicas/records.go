package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/backoff"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// engineRecord is what the agent keeps in its data dir about each engine
// process it runs, so that the next agent can re-adopt the engine instead
// of reloading it (design §6 "Engines outlive the agent": vLLM takes minutes
// to load weights; an agent upgrade must not cost that). It is written when
// a process starts and removed when the agent stops it or sees it exit; an
// agent that exits leaving engines running leaves their records behind.
type engineRecord struct {
	ReplicaID   string `json:"replica_id"`
	UID         uint64 `json:"uid"`
	Incarnation uint64 `json:"incarnation"`
	Restarts    uint32 `json:"restarts"`
	PID         int    `json:"pid"`
	// PIDStart is the process's start time from /proc/PID/stat: a pid the
	// kernel gave to another process since is not mistaken for the engine.
	PIDStart        uint64 `json:"pid_start"`
	Address         string `json:"address"`
	HealthURL       string `json:"health_url"`
	StartedUnixNano int64  `json:"started_unix_nano"`
	// Ports are the engine's ports by purpose (http, kv-events,
	// kv-replay), restored into the port store so nothing else gets them.
	Ports map[string]int `json:"ports"`
	// Replica and Model are the placement and model the engine was started
	// for (protojson), to supervise and relaunch it before the control
	// plane has said anything.
	Replica json.RawMessage `json:"replica"`
	Model   json.RawMessage `json:"model"`

	replica *llmgwv1.Replica
	model   *llmgwv1.Model
}

// parseEngineRecord decodes and checks one record file. Anything that
// cannot name one live process of one replica is refused: adopting the
// wrong process is worse than reloading an engine.
func parseEngineRecord(b []byte) (*engineRecord, error) {
	var r engineRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("engine record: %w", err)
	}
	switch {
	case r.ReplicaID == "":
		return nil, errors.New("engine record: replica_id: required")
	case r.PID <= 1:
		return nil, fmt.Errorf("engine record: pid: %d is not an engine's", r.PID)
	case r.PIDStart == 0:
		return nil, errors.New("engine record: pid_start: required")
	case r.Incarnation == 0:
		return nil, errors.New("engine record: incarnation: must be at least 1")
	case !strings.HasPrefix(r.HealthURL, "http://") && !strings.HasPrefix(r.HealthURL, "https://"):
		return nil, fmt.Errorf("engine record: health_url: %q is not an http URL", r.HealthURL)
	}
	for k, p := range r.Ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("engine record: ports: %q has port %d", k, p)
		}
	}
	r.replica, r.model = &llmgwv1.Replica{}, &llmgwv1.Model{}
	if err := protojson.Unmarshal(r.Replica, r.replica); err != nil {
		return nil, fmt.Errorf("engine record: replica: %w", err)
	}
	if err := protojson.Unmarshal(r.Model, r.model); err != nil {
		return nil, fmt.Errorf("engine record: model: %w", err)
	}
	if r.replica.GetId() != r.ReplicaID || r.replica.GetUid() != r.UID {
		return nil, fmt.Errorf("engine record: replica %s/%d does not match %s/%d",
			r.replica.GetId(), r.replica.GetUid(), r.ReplicaID, r.UID)
	}
	if r.replica.GetModel() != r.model.GetName() {
		return nil, fmt.Errorf("engine record: replica's model %q is not %q", r.replica.GetModel(), r.model.GetName())
	}
	return &r, nil
}

// engineRecords keeps the records in one directory, a file per replica.
type engineRecords struct{ dir string }

func (e engineRecords) path(replicaID string) string {
	return filepath.Join(e.dir, url.PathEscape(replicaID)+".json")
}

func (e engineRecords) save(r *engineRecord) error {
	var err error
	if r.Replica, err = protojson.Marshal(r.replica); err != nil {
		return fmt.Errorf("engine record %s: %w", r.ReplicaID, err)
	}
	if r.Model, err = protojson.Marshal(r.model); err != nil {
		return fmt.Errorf("engine record %s: %w", r.ReplicaID, err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("engine record %s: %w", r.ReplicaID, err)
	}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return fmt.Errorf("engine record %s: %w", r.ReplicaID, err)
	}
	if err := datadir.WriteFileAtomic(e.path(r.ReplicaID), append(b, '\n')); err != nil {
		return fmt.Errorf("engine record %s: %w", r.ReplicaID, err)
	}
	return nil
}

func (e engineRecords) remove(replicaID string) error {
	if err := os.Remove(e.path(replicaID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("engine record %s: %w", replicaID, err)
	}
	return nil
}

// load returns every readable record, sorted by replica id, and removes
// the files it cannot read: they name nothing the agent can adopt.
func (e engineRecords) load() ([]*engineRecord, []error) {
	entries, err := os.ReadDir(e.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("engine records: %w", err)}
	}
	var out []*engineRecord
	var errs []error
	for _, ent := range entries {
		if ent.IsDir() || !strings.HasSuffix(ent.Name(), ".json") {
			continue
		}
		p := filepath.Join(e.dir, ent.Name())
		b, err := os.ReadFile(p)
		if err == nil {
			var r *engineRecord
			if r, err = parseEngineRecord(b); err == nil {
				out = append(out, r)
				continue
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
		_ = os.Remove(p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ReplicaID < out[j].ReplicaID })
	return out, errs
}

func (r *engineRecord) adoption() supervisor.Adoption {
	return supervisor.Adoption{Pid: r.PID, StartTime: r.PIDStart, Incarnation: r.Incarnation,
		Restarts: r.Restarts, Started: time.Unix(0, r.StartedUnixNano)}
}

// healthy asks the engine's health URL up to tries times, spaced by
// every; the same check the supervisor makes of a starting engine.
func healthy(ctx context.Context, healthURL string, tries int, every time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last error
	for i := 0; i < tries; i++ {
		if i > 0 {
			if !backoff.Sleep(ctx, every) {
				return ctx.Err()
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, healthURL, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("health: %s", resp.Status)
	}
	return last
}

// adoptTries is how many health probes an engine left by an earlier agent
// gets before it is stopped rather than adopted.
const adoptTries = 3

// adopt takes over the engines an earlier agent left running (design §6):
// each whose process is still the one recorded and answers its health
// check is supervised again under its old incarnation, before any session
// starts, so the first hello already lists it READY. The control plane's
// first desired set then decides as for any running replica: the same
// (id, uid) keeps running, anything else is stopped. An engine that is
// alive but unhealthy is stopped: it holds the port and GPUs a fresh start
// needs.
func (rs *Set) adopt(ctx context.Context) {
	recs, errs := rs.records.load()
	for _, err := range errs {
		rs.log.Warn("unreadable engine record removed", "err", err)
	}
	for _, rec := range recs {
		log := rs.log.With("replica", rec.ReplicaID, "model", rec.replica.GetModel(), "pid", rec.PID)
		ad := rec.adoption()
		if !supervisor.SameProcess(rec.PID, rec.PIDStart) {
			log.Info("engine left by the previous agent is gone")
			rs.metrics.adoptions.WithLabelValues("gone").Inc()
			rs.dropRecord(rec.ReplicaID)
			continue
		}
		if err := healthy(ctx, rec.HealthURL, adoptTries, rs.cfg.ProbeInterval); err != nil {
			log.Warn("engine left by the previous agent fails its health check; stopping it", "err", err)
			rs.metrics.adoptions.WithLabelValues("unhealthy").Inc()
			supervisor.StopAdopted(ad, rs.cfg.StopGrace)
			rs.dropRecord(rec.ReplicaID)
			continue
		}
		for key, port := range rec.Ports {
			if err := rs.ports.Hold(rec.ReplicaID+"/"+key, port); err != nil {
				log.Warn("adopted engine's port", "err", err)
			}
		}
		log.Info("re-adopting engine", "incarnation", rec.Incarnation, "address", rec.Address)
		rs.metrics.adoptions.WithLabelValues("adopted").Inc()
		// Booked before its supervisor starts (whose reports come after),
		// so the first hello lists it as it is: READY.
		st := &llmgwv1.ReplicaStatus{ReplicaId: rec.ReplicaID, Uid: rec.UID, Incarnation: rec.Incarnation,
			Model: rec.replica.GetModel(), Node: rs.cfg.NodeID, Address: rec.Address, Pid: int32(rec.PID),
			Restarts: rec.Restarts, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, UpdatedUnixNano: rs.now().UnixNano()}
		rs.metrics.setPhase(st.GetReplicaId(), st.GetModel(), st.GetPhase())
		rs.book.put(st)
		rs.mu.Lock()
		rs.startLocked(rec.replica, rec.model, nil, &ad)
		rs.mu.Unlock()
	}
}

func (rs *Set) dropRecord(id string) {
	if err := rs.records.remove(id); err != nil {
		rs.log.Warn("removing engine record", "replica", id, "err", err)
	}
}

// record keeps the data dir's engine record in step with a runner's
// statuses: written when a new process is reported, removed when the
// process is reported gone. Called from the runner's supervisor goroutine,
// in order.
func (rs *Set) record(r *runner, st *llmgwv1.ReplicaStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid := int(st.GetPid())
	switch {
	case pid > 0 && pid != r.recordedPid:
		start, err := supervisor.ProcStartTime(pid)
		if err != nil {
			// Gone already: the supervisor reports its exit next.
			return
		}
		rec := &engineRecord{ReplicaID: r.replica.GetId(), UID: r.replica.GetUid(), Incarnation: st.GetIncarnation(),
			Restarts: st.GetRestarts(), PID: pid, PIDStart: start, Address: r.launch.Address,
			HealthURL: r.launch.HealthURL, StartedUnixNano: rs.now().UnixNano(), Ports: r.ports,
			replica: r.replica, model: r.model}
		if r.adopted != nil && r.adopted.Pid == pid {
			rec.StartedUnixNano = r.adopted.Started.UnixNano()
		}
		if err := rs.records.save(rec); err != nil {
			rs.log.Warn("engine record not saved; the engine will not be re-adopted", "replica", rec.ReplicaID, "err", err)
			return
		}
		r.recordedPid = pid
	case pid == 0 && r.recordedPid != 0:
		switch st.GetPhase() {
		case llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED, llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING,
			llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED:
			rs.dropRecord(r.replica.GetId())
			r.recordedPid = 0
		}
	}
}
