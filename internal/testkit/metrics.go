package testkit

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Labels selects samples by label: each pair name, value must be on the
// sample; labels it does not name may have any value. Nil selects every
// sample of the family.
type Labels map[string]string

// Metric sums the samples of the family name in g that match labels: a
// counter's or gauge's value, a histogram's or summary's sample count. A
// family or sample that does not exist reads 0, as a counter that never
// moved: a test that needs to tell them apart uses Gathered.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels Labels) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather %s: %v", name, err)
	}
	v, _ := sum(mfs, name, labels)
	return v
}

// Gathered is Metric without a *testing.T, and says whether any sample
// matched.
func Gathered(g prometheus.Gatherer, name string, labels Labels) (float64, bool, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, err
	}
	v, ok := sum(mfs, name, labels)
	return v, ok, nil
}

// WaitMetric polls the family name in g until its matching samples sum to
// want, failing t after DefaultTimeout with the last value seen.
func WaitMetric(t testing.TB, g prometheus.Gatherer, name string, labels Labels, want float64) {
	t.Helper()
	var got float64
	if !Eventually(DefaultTimeout, func() bool {
		got, _, _ = Gathered(g, name, labels)
		return got == want
	}) {
		t.Fatalf("timed out after %v waiting for %s%v = %v (last %v)", DefaultTimeout, name, labels, want, got)
	}
}

// scrapeClient bounds a scrape: a process that accepts and never answers
// must not hang the test past its own deadline.
var scrapeClient = &http.Client{Timeout: 10 * time.Second}

// Scrape reads the Prometheus text exposition at url (a whole URL, or a
// host:port whose /metrics is read) and sums the samples of the family name
// that match labels. ok is false when the page could not be read or parsed
// or no sample matched, so a caller polling a process that is starting can
// tell "not yet" from 0.
func Scrape(url, name string, labels Labels) (v float64, ok bool) {
	return ScrapeWith(scrapeClient, url, name, labels)
}

// ScrapeWith is Scrape through client: for a page behind mutual TLS, such
// as a router's operations port, read with a certificate.
func ScrapeWith(client *http.Client, url, name string, labels Labels) (v float64, ok bool) {
	mfs, err := scrape(client, url)
	if err != nil {
		return 0, false
	}
	return sum(mfs, name, labels)
}

// MustScrape is Scrape that fails t when the page cannot be read; a family
// with no matching sample reads 0.
func MustScrape(t testing.TB, url, name string, labels Labels) float64 {
	t.Helper()
	mfs, err := scrape(scrapeClient, url)
	if err != nil {
		t.Fatalf("scrape %s: %v", name, err)
	}
	v, _ := sum(mfs, name, labels)
	return v
}

func scrape(client *http.Client, url string) ([]*dto.MetricFamily, error) {
	if !strings.Contains(url, "://") {
		url = "http://" + url + "/metrics"
	}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	mfs := make([]*dto.MetricFamily, 0, len(fams))
	for _, mf := range fams {
		mfs = append(mfs, mf)
	}
	return mfs, nil
}

func sum(mfs []*dto.MetricFamily, name string, labels Labels) (float64, bool) {
	var total float64
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, labels) {
				continue
			}
			total += value(m)
			found = true
		}
	}
	return total, found
}

func matches(m *dto.Metric, labels Labels) bool {
	for k, want := range labels {
		ok := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == want {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	}
	panic(fmt.Sprintf("testkit: a metric of no known type: %v", m))
}
