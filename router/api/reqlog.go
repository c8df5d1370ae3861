package api

import (
	"context"
	"log/slog"
)

// reqHandler is a request's log handler: the request's attributes
// (request id, key, model, adapter) are added to a record only when one
// is written. slog.Logger.With would format them into the handler for
// every request up front (a JSON handler pre-encodes its attributes), a
// cost paid on the data path for log lines that, for a request that goes
// well, are never written at the router's default level.
type reqHandler struct {
	base                    slog.Handler
	id, key, model, adapter string
}

// newReqLog returns a logger over base carrying the request's id and key.
func newReqLog(base slog.Handler, id, key string) (*slog.Logger, *reqHandler) {
	h := &reqHandler{base: base, id: id, key: key}
	return slog.New(h), h
}

// withTarget returns a logger that also carries the model and adapter.
func (h *reqHandler) withTarget(model, adapter string) *slog.Logger {
	c := *h
	c.model, c.adapter = model, adapter
	return slog.New(&c)
}

func (h *reqHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.base.Enabled(ctx, l) }

func (h *reqHandler) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(slog.String("request_id", h.id))
	if h.key != "" {
		r.AddAttrs(slog.String("key", h.key))
	}
	if h.model != "" {
		r.AddAttrs(slog.String("model", h.model))
	}
	if h.adapter != "" {
		r.AddAttrs(slog.String("adapter", h.adapter))
	}
	return h.base.Handle(ctx, r)
}

// WithAttrs and WithGroup (rare, off the data path: an adapter wait's
// logger) fix the request's attributes into the handler as With would.
func (h *reqHandler) WithAttrs(as []slog.Attr) slog.Handler { return h.fixed().WithAttrs(as) }
func (h *reqHandler) WithGroup(name string) slog.Handler    { return h.fixed().WithGroup(name) }

func (h *reqHandler) fixed() slog.Handler {
	as := []slog.Attr{slog.String("request_id", h.id)}
	if h.key != "" {
		as = append(as, slog.String("key", h.key))
	}
	if h.model != "" {
		as = append(as, slog.String("model", h.model))
	}
	if h.adapter != "" {
		as = append(as, slog.String("adapter", h.adapter))
	}
	return h.base.WithAttrs(as)
}
