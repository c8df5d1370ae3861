package bench

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// palette colours the targets; it repeats past its end.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"}

// Chart geometry, in SVG user units.
const (
	chartWidth  = 960
	panelHeight = 240
	marginLeft  = 80
	headerH     = 90
	panelGap    = 70
	lineH       = 16
)

// series is one target over its runs (one per seed): what a chart's bars
// and curve show for it.
type series struct {
	label string
	runs  []Report
}

// seriesOf groups the runs by label, in the order of their first run.
func seriesOf(res Result) []series {
	var out []series
	for _, r := range res.Runs {
		i := slices.IndexFunc(out, func(s series) bool { return s.label == r.Label })
		if i < 0 {
			out = append(out, series{label: r.Label})
			i = len(out) - 1
		}
		out[i].runs = append(out[i].runs, r)
	}
	return out
}

// spread is a measure over the series' runs.
func (s series) spread(get func(Report) (float64, bool)) (Spread, bool) {
	var xs []float64
	for _, r := range s.runs {
		if v, ok := get(r); ok {
			xs = append(xs, v)
		}
	}
	return spreadOf(xs), len(xs) > 0
}

// cdf pools the series' TTFT quantiles, sorted.
func (s series) cdf() []float64 {
	var xs []float64
	for _, r := range s.runs {
		xs = append(xs, r.TTFTQuantiles...)
	}
	slices.Sort(xs)
	return xs
}

// WriteChart writes a self-contained SVG of the runs, to open in a browser.
// A caption gives the run's settings and seeds. Panels: TTFT, inter-token
// and end-to-end latency (p50, p90, p99 bars), the cache-hit share beside
// its ceiling, and the TTFT CDF; every bar carries its value. With several
// seeds a bar is the mean over them with a whisker from the lowest to the
// highest seed, and a last panel lists the seed-by-seed wins.
func WriteChart(w io.Writer, res Result) error {
	bw := bufio.NewWriter(w)
	ss := seriesOf(res)
	var winLines []string
	if res.Summary != nil {
		for _, p := range res.Summary.Wins {
			winLines = append(winLines, fmt.Sprintf("%s: %s %d – %d %s%s", measureByKey(p.Measure).name, p.A, p.AWins, p.BWins, p.B, ties(p.Ties)))
		}
	}
	panels := 5
	height := headerH + panels*(panelHeight+panelGap)
	if len(winLines) > 0 {
		height += 40 + lineH*len(winLines)
	}
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title := "llmgwctl bench"
	if len(res.Runs) > 0 {
		title += " — " + res.Runs[0].Workload
	}
	text(bw, marginLeft, 24, "start", 16, title)
	for i, line := range caption(res) {
		fmt.Fprintf(bw, `<g class="caption">`)
		text(bw, marginLeft, 44+float64(i)*lineH, "start", 11, line)
		fmt.Fprintln(bw, `</g>`)
	}
	legend(bw, ss, marginLeft, 72)

	plotW := float64(chartWidth - marginLeft - 30)
	plotH := float64(panelHeight - 40)
	y0 := float64(headerH + 40)
	for _, p := range []struct {
		title string
		get   func(Report) Summary
	}{
		{"Time to first token", func(r Report) Summary { return r.TTFT }},
		{"Inter-token latency", func(r Report) Summary { return r.ITL }},
		{"End-to-end latency", func(r Report) Summary { return r.E2E }},
	} {
		latencyBars(bw, ss, p.title, p.get, marginLeft, y0, plotW, plotH)
		y0 += panelHeight + panelGap
	}
	hitBars(bw, ss, marginLeft, y0, plotW, plotH)
	y0 += panelHeight + panelGap
	ttftCDF(bw, ss, marginLeft, y0, plotW, plotH)
	if len(winLines) > 0 {
		y0 += panelHeight + panelGap - 10
		text(bw, marginLeft, y0, "start", 13, fmt.Sprintf("Seed-by-seed wins over %d seeds (higher hit share, lower latency; ties count for neither)", len(res.Summary.Seeds)))
		for i, l := range winLines {
			fmt.Fprintf(bw, `<g class="wins">`)
			text(bw, marginLeft+10, y0+float64(i+1)*lineH+4, "start", 12, l)
			fmt.Fprintln(bw, `</g>`)
		}
	}
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

func ties(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d ties)", n)
}

// caption is the run's settings: the workload and load flags, the seeds,
// and whether the caches were reset.
func caption(res Result) []string {
	if len(res.Runs) == 0 {
		return nil
	}
	r := res.Runs[0]
	var seeds []uint64
	reset := true
	for _, r := range res.Runs {
		if !slices.Contains(seeds, r.Seed) {
			seeds = append(seeds, r.Seed)
		}
		reset = reset && r.CachesReset
	}
	seedText := "seed " + strconv.FormatUint(seeds[0], 10)
	if len(seeds) > 1 {
		seedText = fmt.Sprintf("%d seeds (%s); bars are means, whiskers the range", len(seeds), seedList(seeds))
	}
	cache := "caches not reset between runs"
	if reset {
		cache = "caches reset before every run"
	}
	line := r.Settings
	if line == "" {
		line = "--workload " + r.Workload
	}
	return []string{line, seedText + "; " + cache}
}

func seedList(seeds []uint64) string {
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = strconv.FormatUint(s, 10)
	}
	if len(parts) > 12 {
		parts = append(parts[:11], "…")
	}
	return strings.Join(parts, ",")
}

func colour(i int) string { return palette[i%len(palette)] }

// text writes an escaped text element.
func text(w io.Writer, x, y float64, anchor string, size int, s string) {
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d">`, x, y, anchor, size)
	_ = xml.EscapeText(w, []byte(s))
	fmt.Fprintln(w, `</text>`)
}

func legend(w io.Writer, ss []series, x, y float64) {
	for i, s := range ss {
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", x, y, colour(i))
		text(w, x+16, y+10, "start", 12, s.label)
		x += 30 + 7*float64(len(s.label))
	}
}

// axis is a y axis from 0 to top in four steps, every tick printed with
// the same number of decimals: the fewest that print each tick exactly.
type axis struct {
	top  float64
	unit string  // " ms" or ""
	mult float64 // 1000 for seconds shown as ms
	dec  int
}

func newAxis(top, mult float64, unit string) axis {
	a := axis{top: top, unit: unit, mult: mult}
	step := top * mult / 4
	for a.dec < 3 && math.Abs(step*math.Pow(10, float64(a.dec))-math.Round(step*math.Pow(10, float64(a.dec)))) > 1e-6 {
		a.dec++
	}
	return a
}

// tick formats a tick value.
func (a axis) tick(v float64) string {
	return strconv.FormatFloat(v*a.mult, 'f', a.dec, 64) + a.unit
}

// value formats a bar's value: three significant figures, whatever the
// axis.
func (a axis) value(v float64) string {
	x := v * a.mult
	dec := 0
	switch ax := math.Abs(x); {
	case ax < 1:
		dec = 3
	case ax < 10:
		dec = 2
	case ax < 100:
		dec = 1
	}
	return strconv.FormatFloat(x, 'f', dec, 64) + a.unit
}

// draw draws the axes, gridlines, ticks and the panel's title.
func (a axis) draw(w io.Writer, x, y, width, height float64, title string) {
	text(w, x, y-14, "start", 13, title)
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, y, x, y+height)
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, y+height, x+width, y+height)
	for i := 0; i <= 4; i++ {
		ty := y + height - height*float64(i)/4
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, ty, x+width, ty)
		fmt.Fprintf(w, `<g class="tick">`)
		text(w, x-6, ty+4, "end", 11, a.tick(a.top*float64(i)/4))
		fmt.Fprintln(w, `</g>`)
	}
}

// niceTop rounds a maximum up to 1, 2 or 5 times a power of ten, so the
// axis ticks are readable.
func niceTop(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 4, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// bar draws one bar of a spread: its mean, a whisker over the range when
// the spread has several seeds, and the mean's value above (or inside the
// top of a tall bar).
func bar(w io.Writer, a axis, bx, by, bw, height float64, fill, label string, s Spread) {
	h := height * min(max(s.Mean/a.top, 0), 1)
	fmt.Fprintf(w, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>`, bx, by+height-h, bw, h, fill)
	_ = xml.EscapeText(w, []byte(label))
	fmt.Fprintln(w, `</title></rect>`)
	top := by + height - h
	if s.N > 1 && s.Max > s.Min {
		lo := by + height - height*min(max(s.Min/a.top, 0), 1)
		hi := by + height - height*min(max(s.Max/a.top, 0), 1)
		cx := bx + bw/2
		fmt.Fprintf(w, `<path class="whisker" d="M%.1f,%.1fV%.1fM%.1f,%.1fH%.1fM%.1f,%.1fH%.1f" stroke="black" fill="none"/>`+"\n",
			cx, lo, hi, cx-4, lo, cx+4, cx-4, hi, cx+4)
		top = min(top, hi)
	}
	fmt.Fprintf(w, `<g class="value">`)
	text(w, bx+bw/2, top-4, "middle", 10, a.value(s.Mean))
	fmt.Fprintln(w, `</g>`)
}

// latencyBars is a panel of p50, p90, p99 bars per target.
func latencyBars(w io.Writer, ss []series, title string, get func(Report) Summary, x, y, width, height float64) {
	quantiles := []struct {
		name string
		get  func(Summary) float64
	}{{"p50", func(s Summary) float64 { return s.P50 }}, {"p90", func(s Summary) float64 { return s.P90 }}, {"p99", func(s Summary) float64 { return s.P99 }}}
	top := 0.0
	for _, s := range ss {
		for _, r := range s.runs {
			top = max(top, get(r).P99)
		}
	}
	a := newAxis(niceTop(top*1.1), 1000, " ms") // room for the labels
	a.draw(w, x, y, width, height, title+": p50, p90, p99")
	n := len(ss)
	if n == 0 {
		return
	}
	groupW := width / float64(len(quantiles))
	barW := math.Min(60, groupW*0.8/float64(n))
	for gi, q := range quantiles {
		gx := x + groupW*float64(gi) + (groupW-barW*float64(n))/2
		for i, s := range ss {
			sp, _ := s.spread(func(r Report) (float64, bool) { return q.get(get(r)), true })
			bar(w, a, gx+barW*float64(i), y, barW-4, height, colour(i), fmt.Sprintf("%s %s: %s", s.label, q.name, fmtSpreadAxis(a, sp)), sp)
		}
		text(w, x+groupW*float64(gi)+groupW/2, y+height+16, "middle", 12, q.name)
	}
}

func fmtSpreadAxis(a axis, s Spread) string {
	if s.N > 1 {
		return fmt.Sprintf("mean %s (%s–%s)", a.value(s.Mean), a.value(s.Min), a.value(s.Max))
	}
	return a.value(s.Mean)
}

// hitBars is the cache-hit share per target beside the ceiling an ideal
// router reaches on the same requests (hatched), with hit/ceiling.
func hitBars(w io.Writer, ss []series, x, y, width, height float64) {
	a := newAxis(1, 1, "")
	a.draw(w, x, y, width, height, "Cache-hit share (cached / prompt tokens) and its ceiling (an ideal router, unbounded caches)")
	fmt.Fprintln(w, `<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#999" stroke-width="2"/></pattern></defs>`)
	n := len(ss)
	if n == 0 {
		return
	}
	slot := width / float64(n)
	barW := math.Min(60, slot*0.35)
	for i, s := range ss {
		bx := x + slot*float64(i) + slot/2 - barW
		hit, _ := s.spread(always(func(r Report) float64 { return r.CacheHitShare }))
		bar(w, a, bx, y, barW-2, height, colour(i), fmt.Sprintf("%s hit share: %s", s.label, fmtSpreadAxis(a, hit)), hit)
		lbl := s.label
		if ceil, ok := s.spread(optional(func(r Report) *float64 { return r.CacheHitCeiling })); ok {
			bar(w, a, bx+barW, y, barW-2, height, "url(#hatch)", fmt.Sprintf("%s ceiling: %s", s.label, fmtSpreadAxis(a, ceil)), ceil)
			if hoc, ok := s.spread(optional(func(r Report) *float64 { return r.HitOverCeiling })); ok {
				lbl += fmt.Sprintf(" (hit/ceiling %.3f)", hoc.Mean)
			}
		}
		text(w, bx+barW, y+height+16, "middle", 12, lbl)
	}
}

func ttftCDF(w io.Writer, ss []series, x, y, width, height float64) {
	right := 0.0
	cdfs := make([][]float64, len(ss))
	for i, s := range ss {
		cdfs[i] = s.cdf()
		if n := len(cdfs[i]); n > 0 {
			right = max(right, cdfs[i][n-1])
		}
	}
	right = niceTop(right)
	a := newAxis(1, 1, "")
	a.draw(w, x, y, width, height, "TTFT CDF (share of requests answered within x)")
	xa := newAxis(right, 1000, " ms")
	for i := 0; i <= 4; i++ {
		fmt.Fprintf(w, `<g class="tick">`)
		text(w, x+width*float64(i)/4, y+height+16, "middle", 11, xa.tick(right*float64(i)/4))
		fmt.Fprintln(w, `</g>`)
	}
	for i, c := range cdfs {
		n := len(c)
		if n == 0 {
			continue
		}
		var pts strings.Builder
		fmt.Fprintf(&pts, "%.1f,%.1f", x, y+height)
		for k := range n {
			px := x + width*c[k]/right
			fmt.Fprintf(&pts, " %.1f,%.1f", px, y+height-height*float64(k)/float64(n))
			fmt.Fprintf(&pts, " %.1f,%.1f", px, y+height-height*float64(k+1)/float64(n))
		}
		fmt.Fprintf(w, `<polyline class="cdf" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colour(i), pts.String())
	}
}
