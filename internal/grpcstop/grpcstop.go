// Package grpcstop stops a gRPC server gracefully, but not forever.
//
// grpc.Server.GracefulStop waits for every open stream to end by itself, and
// llmgw's streams (agent sessions, watch streams, load subscriptions) never
// do: a stuck or slow peer would hold a shutdown open indefinitely. So every
// server in llmgw stops the same way: GracefulStop, and Stop (which cuts the
// remaining streams) once a deadline passes. Callers cancel their own
// streams' contexts first, so in the common case GracefulStop returns at once.
//
// It imports only the standard library (design §3): *grpc.Server satisfies
// Server without this package naming grpc.
package grpcstop

import "time"

// Server is what Stop needs of a *grpc.Server.
type Server interface {
	// GracefulStop stops accepting and waits for the open RPCs to finish.
	GracefulStop()
	// Stop closes every connection and cancels the open RPCs at once.
	Stop()
}

// Stop runs s.GracefulStop, and s.Stop if it has not returned within
// timeout; it returns once the server has stopped either way. It reports
// whether the stop was graceful.
func Stop(s Server, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { defer close(done); s.GracefulStop() }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		s.Stop()
		<-done
		return false
	}
}
