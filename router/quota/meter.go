package quota

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// flush sends the usage metered since the last batch as one batch, or the
// batch still unacknowledged again first (same seq: the roll-up applies
// it once). Usage metered meanwhile waits for the next batch. A batch the
// control plane refused as malformed is dropped and logged: sending it
// again would not change the answer.
func (q *Quota) flush(ctx context.Context) {
	q.flushMu.Lock()
	defer q.flushMu.Unlock()
	for range 2 { // the batch in flight, then a new one
		if q.batch == nil {
			q.batch = q.collect()
			if q.batch == nil {
				return
			}
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := q.client.RecordUsage(cctx, q.batch)
		cancel()
		if err != nil {
			q.m.flushFailures.Inc()
			if errors.Is(err, ErrRefused) {
				q.log.Error("quota: the control plane refused a usage batch; dropping it", "seq", q.batch.Seq, "err", err)
				q.acknowledge()
				continue
			}
			q.log.Debug("quota: usage flush failed; sending it again later", "seq", q.batch.Seq, "err", err)
			return
		}
		q.acknowledge()
	}
}

// ErrRefused marks a Client error for a batch the control plane refused
// as malformed (INVALID_ARGUMENT): it is dropped, not sent again.
var ErrRefused = errors.New("usage batch refused")

// maxBatchRows bounds a batch below the control plane's bound (8192).
const maxBatchRows = 4096

// collect moves every tenant's metered usage into a new batch (nil when
// there is none).
func (q *Quota) collect() *llmgwv1.RecordUsageCommand {
	q.mu.RLock()
	ts := slices.Collect(maps.Values(q.state))
	q.mu.RUnlock()
	var rows []*llmgwv1.UsageRow
	for _, t := range ts {
		t.mu.Lock()
		t.gen++
		for k, c := range t.usage {
			if len(rows) == maxBatchRows {
				break // the rest goes in the next batch
			}
			rows = append(rows, &llmgwv1.UsageRow{Tenant: t.name, Model: k.model, HourUnix: k.hour, Counts: c})
			delete(t.usage, k)
		}
		t.inBatch += t.unflushed
		t.unflushed = 0
		for m, v := range t.unflushedModel {
			t.inBatchModel[m] += v
		}
		clear(t.unflushedModel)
		t.mu.Unlock()
	}
	if len(rows) == 0 {
		return nil
	}
	slices.SortFunc(rows, func(a, b *llmgwv1.UsageRow) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return int(a.HourUnix - b.HourUnix)
	})
	q.seq++
	return &llmgwv1.RecordUsageCommand{Router: q.cfg.Router, Session: q.session, Seq: q.seq, Rows: rows}
}

// acknowledge ends the batch in flight: its tokens are in the roll-up now
// (or dropped), no longer the router's to claim.
func (q *Quota) acknowledge() {
	q.batch = nil
	q.mu.RLock()
	ts := slices.Collect(maps.Values(q.state))
	q.mu.RUnlock()
	for _, t := range ts {
		t.mu.Lock()
		t.inBatch = 0
		clear(t.inBatchModel)
		t.mu.Unlock()
	}
}
