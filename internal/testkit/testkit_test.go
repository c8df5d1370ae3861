package testkit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEventually(t *testing.T) {
	var n atomic.Int32
	if !Eventually(5*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("a condition met on the third poll was reported unmet")
	}
	if Eventually(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition never met was reported met")
	}
}

func TestEventuallyErrReturnsLastError(t *testing.T) {
	want := errors.New("replica 2 not ready")
	if err := EventuallyErr(50*time.Millisecond, func() error { return want }); !errors.Is(err, want) {
		t.Fatalf("got %v, want the condition's last error", err)
	}
	if err := EventuallyErr(time.Second, func() error { return nil }); err != nil {
		t.Fatalf("got %v for a met condition", err)
	}
}

func TestUntilEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	err := Until(ctx, func() error { calls++; return errNotYet })
	if !errors.Is(err, errNotYet) || calls != 1 {
		t.Fatalf("got %v after %d calls; want the condition tried once and its error", err, calls)
	}
}

func registry(t *testing.T) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total"}, []string{"model", "result"})
	reg.MustRegister(c)
	c.WithLabelValues("a", "ok").Add(2)
	c.WithLabelValues("a", "failed").Add(3)
	c.WithLabelValues("b", "ok").Add(5)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "y_seconds"})
	reg.MustRegister(h)
	h.Observe(1)
	h.Observe(2)
	return reg
}

func TestMetric(t *testing.T) {
	reg := registry(t)
	tests := []struct {
		name   string
		labels Labels
		want   float64
		found  bool
	}{
		{"x_total", nil, 10, true},
		{"x_total", Labels{"model": "a"}, 5, true},
		{"x_total", Labels{"model": "a", "result": "ok"}, 2, true},
		{"x_total", Labels{"model": "c"}, 0, false},
		{"y_seconds", nil, 2, true},
		{"absent_total", nil, 0, false},
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for _, tt := range tests {
		if got := Metric(t, reg, tt.name, tt.labels); got != tt.want {
			t.Errorf("Metric(%s, %v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
		got, found, err := Gathered(reg, tt.name, tt.labels)
		if err != nil || got != tt.want || found != tt.found {
			t.Errorf("Gathered(%s, %v) = %v, %v, %v; want %v, %v", tt.name, tt.labels, got, found, err, tt.want, tt.found)
		}
		got, found = Scrape(srv.URL+"/metrics", tt.name, tt.labels)
		if got != tt.want || found != tt.found {
			t.Errorf("Scrape(%s, %v) = %v, %v; want %v, %v", tt.name, tt.labels, got, found, tt.want, tt.found)
		}
		if got := MustScrape(t, srv.Listener.Addr().String(), tt.name, tt.labels); got != tt.want {
			t.Errorf("MustScrape(host:port, %s, %v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}

func TestScrapeUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	if _, ok := Scrape(srv.URL+"/metrics", "x_total", nil); ok {
		t.Fatal("a 404 page was read as a metric")
	}
}

func TestWaitMetric(t *testing.T) {
	reg := registry(t)
	WaitMetric(t, reg, "x_total", Labels{"model": "b"}, 5)
}

func TestThroughout(t *testing.T) {
	var n atomic.Int32
	if err := Throughout(60*time.Millisecond, 10*time.Millisecond, func() error { n.Add(1); return nil }); err != nil {
		t.Fatalf("a check that always holds: %v", err)
	}
	if n.Load() < 2 {
		t.Fatalf("checked %d times over 60ms at 10ms, want several", n.Load())
	}
	want := errors.New("the foreign server is a member")
	calls := 0
	err := Throughout(time.Minute, time.Millisecond, func() error {
		calls++
		if calls == 3 {
			return want
		}
		return nil
	})
	if !errors.Is(err, want) || calls != 3 {
		t.Fatalf("got %v after %d calls; want the third call's error at once", err, calls)
	}
}
