package router

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofServer is the opt-in profiling listener (--pprof-addr): Go's
// net/http/pprof handlers on their own loopback address, never on the
// API's, so profiles (which show request contents in goroutine stacks
// and cost CPU to take) reach only whoever is on the machine.
type pprofServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// startPprof listens on addr (already checked to be loopback by
// Config.Validate) and serves the profiles until stop.
func startPprof(addr string, log *slog.Logger) (*pprofServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("router: --pprof-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	p := &pprofServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() { p.done <- p.srv.Serve(ln) }()
	log.Info("router: serving pprof", "addr", ln.Addr().String())
	return p, nil
}

// stop closes the listener and any profile being taken, and waits for
// the server to end.
func (p *pprofServer) stop() {
	if p == nil {
		return
	}
	_ = p.srv.Close()
	if err := <-p.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		p.srv.ErrorLog.Printf("router: pprof server: %v", err)
	}
}

// addr is where the profiles are served, for tests.
func (p *pprofServer) addr() string { return p.ln.Addr().String() }
