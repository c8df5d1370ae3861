package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestParseSeeds(t *testing.T) {
	tests := []struct {
		in      string
		first   uint64
		want    []uint64
		wantErr string
	}{
		{in: "3", first: 1, want: []uint64{1, 2, 3}},
		{in: "2", first: 40, want: []uint64{40, 41}},
		{in: "1,4,7", want: []uint64{1, 4, 7}},
		{in: "5-8", want: []uint64{5, 6, 7, 8}},
		{in: "1-2,9", want: []uint64{1, 2, 9}},
		{in: "0", wantErr: "a count must be"},
		{in: "x", wantErr: "--seeds"},
		{in: "3-1", wantErr: "low ≤ high"},
		{in: "1,1", wantErr: "twice"},
		{in: "1-5000", wantErr: "at most 1000"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSeeds(tt.in, tt.first)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func ptr(v float64) *float64 { return &v }

// seedRuns are two targets over three seeds: a has the better hit share
// on seeds 1 and 2, b on 3; TTFT p50 ties on seed 2.
func seedRuns() []Report {
	mk := func(label string, seed uint64, hit, ceil, p50, p90 float64) Report {
		r := Report{Label: label, Seed: seed, Workload: SharedPrefix, Settings: "--workload shared-prefix --groups 8",
			CacheHitShare: hit, CacheHitCeiling: ptr(ceil), HitOverCeiling: ptr(hit / ceil), CachesReset: true,
			TTFTQuantiles: []float64{p50 / 2, p50, p90}}
		r.TTFT.P50, r.TTFT.P90, r.TTFT.P99 = p50, p90, p90*1.5
		r.ITL.P50, r.ITL.P90, r.ITL.P99 = 0.010, 0.012, 0.020
		r.E2E.P50, r.E2E.P90, r.E2E.P99 = 0.3, 0.5, 0.7
		return r
	}
	return []Report{
		mk("a", 1, 0.8, 0.9, 0.050, 0.100), mk("b", 1, 0.4, 0.9, 0.100, 0.300),
		mk("b", 2, 0.5, 0.8, 0.060, 0.200), mk("a", 2, 0.7, 0.8, 0.060, 0.150),
		mk("a", 3, 0.3, 0.7, 0.090, 0.400), mk("b", 3, 0.6, 0.7, 0.040, 0.100),
	}
}

func TestSummarizeSeeds(t *testing.T) {
	s := SummarizeSeeds(seedRuns())
	if !slices.Equal(s.Seeds, []uint64{1, 2, 3}) || len(s.Targets) != 2 || s.Targets[0].Label != "a" {
		t.Fatalf("seeds %v targets %+v", s.Seeds, s.Targets)
	}
	hit := s.Targets[0].Measures["cache_hit_share"]
	if hit.N != 3 || hit.Min != 0.3 || hit.Max != 0.8 || hit.Mean < 0.5999 || hit.Mean > 0.6001 {
		t.Fatalf("a's hit share %+v, want mean 0.6 over 0.3–0.8", hit)
	}
	wins := map[string]PairWins{}
	for _, w := range s.Wins {
		if w.A != "a" || w.B != "b" {
			t.Fatalf("pair %s vs %s", w.A, w.B)
		}
		wins[w.Measure] = w
	}
	for _, tt := range []struct {
		measure     string
		a, b, tiesN int
	}{
		{"cache_hit_share", 2, 1, 0},
		{"hit_over_ceiling", 2, 1, 0},
		{"ttft_p50_seconds", 1, 1, 1}, // lower is better; seed 2 ties
		{"ttft_p90_seconds", 2, 1, 0},
	} {
		w := wins[tt.measure]
		if w.AWins != tt.a || w.BWins != tt.b || w.Ties != tt.tiesN {
			t.Fatalf("%s: %d-%d (%d ties), want %d-%d (%d)", tt.measure, w.AWins, w.BWins, w.Ties, tt.a, tt.b, tt.tiesN)
		}
	}
	header, rows := s.Table()
	if !slices.Equal(header, []string{"SUMMARY", "a", "b"}) {
		t.Fatalf("header %v", header)
	}
	var text []string
	for _, r := range rows {
		if len(r) != 3 {
			t.Fatalf("row %v: %d cells", r, len(r))
		}
		text = append(text, strings.Join(r, " | "))
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"hit share mean (range) | 0.600 (0.300–0.800) | 0.500 (0.400–0.600)", "hit share wins | a 2-1 b", "ttft p50 wins | a 1-1 b (1 ties)", "ttft p90 (ms) mean (range) | 216.7 (100.0–400.0)"} {
		if !strings.Contains(all, want) {
			t.Fatalf("summary table lacks %q:\n%s", want, all)
		}
	}
}

func TestAxisTicksShareTheirDecimals(t *testing.T) {
	tests := []struct {
		top  float64
		mult float64
		unit string
		want []string
	}{
		{0.1, 1000, " ms", []string{"0 ms", "25 ms", "50 ms", "75 ms", "100 ms"}},
		{0.01, 1000, " ms", []string{"0.0 ms", "2.5 ms", "5.0 ms", "7.5 ms", "10.0 ms"}},
		{0.4, 1000, " ms", []string{"0 ms", "100 ms", "200 ms", "300 ms", "400 ms"}},
		{0.001, 1000, " ms", []string{"0.00 ms", "0.25 ms", "0.50 ms", "0.75 ms", "1.00 ms"}},
		{1, 1, "", []string{"0.00", "0.25", "0.50", "0.75", "1.00"}},
		{2, 1000, " ms", []string{"0 ms", "500 ms", "1000 ms", "1500 ms", "2000 ms"}},
	}
	for _, tt := range tests {
		a := newAxis(tt.top, tt.mult, tt.unit)
		var got []string
		for i := 0; i <= 4; i++ {
			got = append(got, a.tick(tt.top*float64(i)/4))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("top %v: ticks %q, want %q", tt.top, got, tt.want)
		}
	}
}

// svgDoc is what the chart tests read of an SVG: the text of every
// element by its class (its own or its group's), and the bars.
type svgDoc struct {
	byClass   map[string][]string
	bars      int
	polylines int
	texts     []string
}

func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	doc := svgDoc{byClass: map[string][]string{}}
	var classes []string
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not XML: %v\n%s", err, b)
		}
		switch se := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = se.Name.Local
			}
			class := ""
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					class = a.Value
				}
			}
			if class == "" && len(classes) > 0 {
				class = classes[len(classes)-1]
			}
			classes = append(classes, class)
			switch se.Name.Local {
			case "rect":
				if class == "bar" {
					doc.bars++
				}
			case "polyline":
				doc.polylines++
			case "text":
				var s string
				if err := d.DecodeElement(&s, &se); err != nil {
					t.Fatal(err)
				}
				classes = classes[:len(classes)-1]
				doc.texts = append(doc.texts, s)
				doc.byClass[class] = append(doc.byClass[class], s)
			}
		case xml.EndElement:
			classes = classes[:len(classes)-1]
		}
	}
	if root != "svg" {
		t.Fatalf("root <%s>, want <svg>", root)
	}
	return doc
}

func TestChartShowsValuesCaptionPanelsAndWins(t *testing.T) {
	tests := []struct {
		name   string
		res    Result
		series int
		seeds  bool
	}{
		{"one seed, two targets", Result{Runs: seedRuns()[:2]}, 2, false},
		{"three seeds", Result{Runs: seedRuns(), Summary: SummarizeSeeds(seedRuns())}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var svg bytes.Buffer
			if err := WriteChart(&svg, tt.res); err != nil {
				t.Fatal(err)
			}
			doc := parseSVG(t, svg.Bytes())
			// 3 latency panels × 3 quantiles per target, hit share and ceiling per target.
			wantBars := tt.series * (9 + 2)
			if doc.bars != wantBars || len(doc.byClass["value"]) != wantBars {
				t.Fatalf("%d bars and %d values, want %d of each", doc.bars, len(doc.byClass["value"]), wantBars)
			}
			if doc.polylines != tt.series {
				t.Fatalf("%d CDF lines, want %d", doc.polylines, tt.series)
			}
			all := strings.Join(doc.texts, "\n")
			for _, want := range []string{"Time to first token", "Inter-token latency", "End-to-end latency", "Cache-hit share", "TTFT CDF", "hit/ceiling"} {
				if !strings.Contains(all, want) {
					t.Fatalf("no %q in the chart", want)
				}
			}
			caption := strings.Join(doc.byClass["caption"], "\n")
			if !strings.Contains(caption, "--groups 8") || !strings.Contains(caption, "caches reset before every run") {
				t.Fatalf("caption %q lacks the settings", caption)
			}
			// Every tick of an axis has the decimals of the others.
			digits := regexp.MustCompile(`^[0-9]+(\.([0-9]+))?( ms)?$`)
			for _, tick := range doc.byClass["tick"] {
				if !digits.MatchString(tick) {
					t.Fatalf("tick %q", tick)
				}
			}
			if strings.Contains(svg.String(), "75.0 ms") {
				t.Fatal(`an axis prints "75.0 ms"`)
			}
			wins := doc.byClass["wins"]
			whiskers := strings.Count(svg.String(), `class="whisker"`)
			if tt.seeds {
				if len(wins) != 4 || !strings.Contains(strings.Join(wins, "\n"), "hit share: a 2 – 1 b") || whiskers == 0 || !strings.Contains(caption, "3 seeds") {
					t.Fatalf("wins %q, %d whiskers, caption %q", wins, whiskers, caption)
				}
			} else if len(wins) != 0 || whiskers != 0 {
				t.Fatalf("one seed drew wins %q and %d whiskers", wins, whiskers)
			}
		})
	}
}
