package scheduler

// Tracer is told the steps of one Pick, for the request's trace (design §9
// "Tracing"): each filter with the candidates it left, each scorer with
// its scores, and the picker's choice. It is called on the request's
// goroutine, at most once per filter, scorer and picker of the profile, so
// a trace holds a bounded number of steps per attempt. Scored's scores
// belong to the scheduler: read them, never keep them.
type Tracer interface {
	Filtered(filter string, left int)
	Scored(scorer string, weight float64, scores []float64)
	Picked(picker string, chosen Key, score float64, candidates int)
}
