package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/capture"
)

// captureMetrics counts the capture's records by what became of them, and
// its rotations, on reg.
func captureMetrics(reg prometheus.Registerer) capture.Metrics {
	records := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_router_capture_records_total",
		Help: "Requests handed to the traffic capture, by result: written, dropped (the writer's queue was full) or error (the file refused it).",
	}, []string{"result"})
	rotations := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgw_router_capture_rotations_total",
		Help: "Capture files rotated (capture.max_bytes reached).",
	})
	reg.MustRegister(records, rotations)
	written, dropped, errs := records.WithLabelValues("written"), records.WithLabelValues("dropped"), records.WithLabelValues("error")
	return capture.Metrics{Written: written.Inc, Dropped: dropped.Inc, Errors: errs.Inc, Rotations: rotations.Inc}
}
