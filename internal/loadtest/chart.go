package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// The chart is hand-built SVG: one panel per kind of figure, a horizontal
// bar per figure, and the figure's target as a dashed mark across its row.

// bar is one row of a panel.
type bar struct {
	label    string
	value    float64
	ok       bool   // measured; otherwise note is shown instead of a bar
	note     string // why not measured
	goal     float64
	hasGoal  bool
	atLeast  bool
	valueTxt string
}

func (b bar) color() string {
	switch {
	case !b.hasGoal:
		return "#607d8b" // no target
	case b.atLeast == (b.value >= b.goal):
		return "#2e7d32" // met
	default:
		return "#c62828" // missed
	}
}

// panel is a group of bars on one axis.
type panel struct {
	title string
	log   bool
	unit  string // "×" or "ms"
	bars  []bar
}

// chartPanels lays the report out as panels: the rate ratios, fan-out
// latency by follower count, and createPost latency.
func (r *report) chartPanels() []panel {
	ratios := panel{title: "Throughput ratios, measured side by side in one run (higher is better)", unit: "×"}
	for _, t := range r.targets() {
		if t.unit != "×" {
			continue
		}
		b := bar{label: t.name, value: t.value, ok: t.measured, note: t.note, goal: t.goal, hasGoal: true, atLeast: true}
		b.valueTxt = fmt.Sprintf("%.2f×", t.value)
		ratios.bars = append(ratios.bars, b)
	}
	fan := panel{title: "Fan-out: createPost answer → last follower's home timeline (log scale, lower is better)", log: true, unit: "ms"}
	for _, f := range r.fan {
		b := bar{label: fmt.Sprintf("%d followers", f.followers), value: ms(f.after), ok: f.runs > 0, note: f.notPushed}
		if g, ok := fanGoals[f.followers]; ok {
			b.goal, b.hasGoal = ms(g), true
		}
		b.valueTxt = short(f.after)
		fan.bars = append(fan.bars, b)
	}
	create := panel{title: fmt.Sprintf("createPost latency, authors with ≤ %d followers (lower is better)", r.opts.fewFollowers), unit: "ms"}
	for _, c := range []struct {
		how string
		r   result
	}{{fmt.Sprintf("%d in flight", r.opts.concurrency), r.create}, {"one at a time", r.createSingle}} {
		create.bars = append(create.bars,
			bar{label: "p50, " + c.how, value: ms(c.r.p50), ok: true, valueTxt: short(c.r.p50)},
			bar{label: "p99, " + c.how, value: ms(c.r.p99), ok: true, valueTxt: short(c.r.p99), goal: ms(goalCreateP99), hasGoal: r.opts.fewFollowers <= goalCreateFollows})
	}
	out := []panel{ratios}
	if len(fan.bars) > 0 {
		out = append(out, fan)
	}
	return append(out, create)
}

// Chart geometry, in pixels.
const (
	chartW   = 860
	labelX   = 330 // labels end here
	plotX0   = 340
	plotX1   = 700
	goalX    = 712 // target column
	rowH     = 26
	barH     = 16
	titleH   = 30
	axisH    = 24
	panelGap = 16
	headerH  = 80
	legendH  = 30
)

// scale maps values of a panel to x positions.
type scale struct {
	lo, hi float64
	log    bool
}

func (s scale) x(v float64) float64 {
	var f float64
	if s.log {
		v = math.Max(v, s.lo)
		f = (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	} else {
		f = (v - s.lo) / (s.hi - s.lo)
	}
	return plotX0 + math.Min(1, math.Max(0, f))*(plotX1-plotX0)
}

// ticks returns the axis marks of s.
func (s scale) ticks() []float64 {
	var t []float64
	if s.log {
		for v := s.lo; v <= s.hi*1.0001; v *= 10 {
			t = append(t, v)
		}
		return t
	}
	step := niceStep(s.hi / 5)
	for i := 0; float64(i)*step <= s.hi*1.0001; i++ {
		// Rounded, so that 3 × 0.2 prints as 0.6.
		t = append(t, math.Round(float64(i)*step*1e9)/1e9)
	}
	return t
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// panelScale fits an axis to a panel's values and goals.
func panelScale(p panel) scale {
	lo, hi := math.Inf(1), 0.0
	for _, b := range p.bars {
		for _, v := range []float64{b.value, b.goal} {
			if v > 0 && (b.ok || v == b.goal) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		hi, lo = 1, 1
	}
	if p.log {
		s := scale{lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi))), log: true}
		if s.hi <= s.lo {
			s.hi = s.lo * 10
		}
		return s
	}
	step := niceStep(hi * 1.1 / 5)
	return scale{lo: 0, hi: math.Ceil(hi*1.1/step) * step}
}

func tickLabel(v float64, unit string) string {
	switch {
	case v == 0:
		return "0"
	case unit == "×":
		return fmt.Sprintf("%g×", v)
	case unit == "ms" && v >= 1000:
		return fmt.Sprintf("%g s", v/1000)
	case unit == "ms" && v < 1:
		return fmt.Sprintf("%g µs", v*1000)
	}
	return fmt.Sprintf("%g %s", v, unit)
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

// writeChart draws r as an SVG document on w, using nothing but text.
func writeChart(w io.Writer, r *report) error {
	panels := r.chartPanels()
	height := headerH + legendH
	for _, p := range panels {
		height += titleH + len(p.bars)*rowH + axisH + panelGap
	}
	var b bytes.Buffer
	text := func(x, y float64, anchor, style, s string) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="%s"%s>%s</text>`+"\n", x, y, anchor, style, xmlEscaper.Replace(s))
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">`+"\n",
		chartW, height, chartW, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartW, height)
	o := r.opts
	text(10, 22, "start", ` font-size="16" font-weight="bold"`, "Warble load test: figures against the targets of “Fan-out at scale”")
	line1 := fmt.Sprintf("%s · %s", machine(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	if o.note != "" {
		line1 = o.note + " · " + line1
	}
	text(10, 40, "start", ` fill="#444"`, line1)
	text(10, 55, "start", ` fill="#444"`, fmt.Sprintf("%d users, %d posts each · %d runs of %s at concurrency %d, medians · tool, server, workers and Redis on the same machine",
		o.users, o.posts, o.runs, o.duration, o.concurrency))
	if n := r.pullNote(); n != "" {
		text(10, 70, "start", ` fill="#444"`, n)
	}

	y := float64(headerH)
	for _, p := range panels {
		s := panelScale(p)
		text(10, y+18, "start", ` font-size="13" font-weight="bold"`, p.title)
		y += titleH
		top, bottom := y, y+float64(len(p.bars)*rowH)
		for _, t := range s.ticks() {
			x := s.x(t)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", x, top, x, bottom)
			text(x, bottom+15, "middle", ` fill="#666" font-size="11"`, tickLabel(t, p.unit))
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#999"/>`+"\n", plotX0, top, plotX0, bottom)
		for i, br := range p.bars {
			ry := top + float64(i*rowH)
			mid := ry + rowH/2
			text(labelX, mid+4, "end", "", br.label)
			if !br.ok {
				note := br.note
				if r := []rune(note); len(r) > 70 {
					note = string(r[:67]) + "…"
				}
				text(plotX0+6, mid+4, "start", ` fill="#888" font-style="italic"`, cellOr(note, "not measured"))
			} else {
				x := s.x(br.value)
				fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n", plotX0, mid-barH/2, math.Max(1, x-plotX0), barH, br.color())
				text(x+4, mid+4, "start", "", br.valueTxt)
			}
			if br.hasGoal {
				gx := s.x(br.goal)
				op := "≤"
				if br.atLeast {
					op = "≥"
				}
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2" stroke-dasharray="4 2"/>`+"\n", gx, ry+1, gx, ry+rowH-1)
				text(goalX, mid+4, "start", ` fill="#333"`, "target "+op+" "+tickLabel(br.goal, p.unit))
			}
		}
		y = bottom + axisH + panelGap
	}
	lx := 10.0
	for _, l := range []struct{ color, text string }{{"#2e7d32", "target met"}, {"#c62828", "target missed"}, {"#607d8b", "no target"}} {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", lx, y, l.color)
		text(lx+16, y+10, "start", "", l.text)
		lx += 130
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2" stroke-dasharray="4 2"/>`+"\n", lx+6, y-1, lx+6, y+13)
	text(lx+14, y+10, "start", "", "target")
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func cellOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// short renders d to three significant digits.
func short(d time.Duration) string {
	for unit := time.Nanosecond; unit < time.Hour; unit *= 10 {
		if d < 1000*unit {
			return d.Round(unit).String()
		}
	}
	return d.Round(time.Second).String()
}
