package bench

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// palette colours the runs; it repeats past its end.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"}

// Chart geometry, in SVG user units.
const (
	chartWidth  = 960
	panelHeight = 260
	marginLeft  = 70
	marginTop   = 50
	panelGap    = 70
)

// WriteChart writes a self-contained SVG of the runs, to open in a browser:
// TTFT p50/p90/p99 bars per run, cache-hit share per run, and the TTFT CDF of
// every run on one plot — the three views that tell routing policies apart.
func WriteChart(w io.Writer, res Result) error {
	bw := bufio.NewWriter(w)
	height := marginTop + 3*panelHeight + 2*panelGap
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title := "llmgwctl bench"
	if len(res.Runs) > 0 {
		title += " — " + res.Runs[0].Workload
	}
	text(bw, marginLeft, 24, "start", 16, title)
	legend(bw, res, chartWidth/2, 13)

	plotW := float64(chartWidth - marginLeft - 30)
	y0 := float64(marginTop + 20)
	ttftBars(bw, res, marginLeft, y0, plotW, panelHeight-40)
	y0 += panelHeight + panelGap
	hitBars(bw, res, marginLeft, y0, plotW, panelHeight-40)
	y0 += panelHeight + panelGap
	ttftCDF(bw, res, marginLeft, y0, plotW, panelHeight-40)
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

func colour(i int) string { return palette[i%len(palette)] }

// text writes an escaped text element.
func text(w io.Writer, x, y float64, anchor string, size int, s string) {
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d">`, x, y, anchor, size)
	_ = xml.EscapeText(w, []byte(s))
	fmt.Fprintln(w, `</text>`)
}

func legend(w io.Writer, res Result, x, y float64) {
	for i, r := range res.Runs {
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", x, y, colour(i))
		text(w, x+16, y+10, "start", 12, r.Label)
		x += 24 + 7*float64(len(r.Label))
	}
}

// axes draws a y axis from 0 to top with a few ticks, and the panel's title.
func axes(w io.Writer, x, y, width, height, top float64, title string, format func(float64) string) {
	text(w, x, y-14, "start", 13, title)
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, y, x, y+height)
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x, y+height, x+width, y+height)
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		ty := y + height - height*float64(i)/4
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, ty, x+width, ty)
		text(w, x-6, ty+4, "end", 11, format(v))
	}
}

// niceTop rounds a maximum up to 1, 2 or 5 times a power of ten, so the
// axis ticks are readable.
func niceTop(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// fmtMS prints seconds as milliseconds, with a decimal only where the
// value needs one (a 12.5 ms tick, a sub-10 ms latency).
func fmtMS(v float64) string {
	ms := v * 1000
	if ms == math.Round(ms) || ms >= 100 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

func ttftBars(w io.Writer, res Result, x, y, width, height float64) {
	top := 0.0
	for _, r := range res.Runs {
		top = max(top, r.TTFT.P99)
	}
	top = niceTop(top)
	axes(w, x, y, width, height, top, "Time to first token: p50, p90, p99", fmtMS)
	n := len(res.Runs)
	if n == 0 {
		return
	}
	groupW := width / 3
	barW := math.Min(40, groupW*0.8/float64(n))
	for gi, q := range []struct {
		name string
		get  func(Summary) float64
	}{{"p50", func(s Summary) float64 { return s.P50 }}, {"p90", func(s Summary) float64 { return s.P90 }}, {"p99", func(s Summary) float64 { return s.P99 }}} {
		gx := x + groupW*float64(gi) + (groupW-barW*float64(n))/2
		for i, r := range res.Runs {
			v := q.get(r.TTFT)
			h := height * v / top
			bx := gx + barW*float64(i)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>`, bx, y+height-h, barW-2, h, colour(i))
			_ = xml.EscapeText(w, []byte(fmt.Sprintf("%s %s: %s", r.Label, q.name, fmtMS(v))))
			fmt.Fprintln(w, `</title></rect>`)
		}
		text(w, x+groupW*float64(gi)+groupW/2, y+height+16, "middle", 12, q.name)
	}
}

func hitBars(w io.Writer, res Result, x, y, width, height float64) {
	axes(w, x, y, width, height, 1, "Cache-hit share (cached / prompt tokens)", func(v float64) string { return fmt.Sprintf("%.2f", v) })
	n := len(res.Runs)
	if n == 0 {
		return
	}
	slot := width / float64(n)
	barW := math.Min(80, slot*0.6)
	for i, r := range res.Runs {
		v := min(max(r.CacheHitShare, 0), 1)
		h := height * v
		bx := x + slot*float64(i) + (slot-barW)/2
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", bx, y+height-h, barW, h, colour(i))
		ly := y + height - h - 4
		if h > 20 { // inside the bar's top, clear of the panel's title
			ly = y + height - h + 14
		}
		text(w, bx+barW/2, ly, "middle", 11, fmt.Sprintf("%.3f", r.CacheHitShare))
		text(w, bx+barW/2, y+height+16, "middle", 12, r.Label)
	}
}

func ttftCDF(w io.Writer, res Result, x, y, width, height float64) {
	right := 0.0
	for _, r := range res.Runs {
		if len(r.TTFTQuantiles) > 0 {
			right = max(right, r.TTFTQuantiles[len(r.TTFTQuantiles)-1])
		}
	}
	right = niceTop(right)
	axes(w, x, y, width, height, 1, "TTFT CDF (share of requests answered within x)", func(v float64) string { return fmt.Sprintf("%.2f", v) })
	for i := 0; i <= 4; i++ {
		text(w, x+width*float64(i)/4, y+height+16, "middle", 11, fmtMS(right*float64(i)/4))
	}
	for i, r := range res.Runs {
		n := len(r.TTFTQuantiles)
		if n == 0 {
			continue
		}
		var pts strings.Builder
		fmt.Fprintf(&pts, "%.1f,%.1f", x, y+height)
		// A step per sample; thinned to at most ~1000 points so a long run
		// still gives a small file.
		step := max(1, n/1000)
		for k := 0; k < n; k += step {
			px := x + width*r.TTFTQuantiles[k]/right
			fmt.Fprintf(&pts, " %.1f,%.1f", px, y+height-height*float64(k)/float64(n))
			fmt.Fprintf(&pts, " %.1f,%.1f", px, y+height-height*float64(k+1)/float64(n))
		}
		fmt.Fprintf(&pts, " %.1f,%.1f", x+width*r.TTFTQuantiles[n-1]/right, y)
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colour(i), pts.String())
	}
}
