package main

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // grey
}

// plots draws every plot whose data this run produced, into the out dir.
func (b *bench) plots() error {
	var made []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(b.opts.out, name)
		if err := p.Save(9*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		made = append(made, path)
		return nil
	}
	if _, ok := b.res.Series["rollout_"+rolloutWindows[0].String()]; ok {
		if err := save(b.rolloutPlot(), "rollout-raft-applies.png"); err != nil {
			return err
		}
	}
	if len(b.res.Latencies) > 0 {
		if err := save(b.latencyHist(), "latency-histogram.png"); err != nil {
			return err
		}
		if err := save(b.latencyCDF(), "latency-cdf.png"); err != nil {
			return err
		}
	}
	if _, ok := b.res.Series["churn"]; ok {
		if err := save(b.churnPlot(), "churn-raft-applies.png"); err != nil {
			return err
		}
	}
	b.res.Plots = made
	for _, m := range made {
		fmt.Printf("plot: %s\n", m)
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

func xys(pts []Point) plotter.XYs {
	out := make(plotter.XYs, len(pts))
	for i, p := range pts {
		out[i].X, out[i].Y = p.T, p.V
	}
	return out
}

// rolloutPlot: cumulative Raft applies during the rollout, one line per window.
func (b *bench) rolloutPlot() *plot.Plot {
	n := b.opts.rolloutEndpoints
	p := newPlot(fmt.Sprintf("Rollout of %d endpoints, %d replaced every %s: Consul Raft applies", n, rolloutBatch, rolloutEvery),
		"seconds since the first EndpointSlice write", "Raft applies (cumulative)")
	for i, w := range rolloutWindows {
		pts := b.res.Series["rollout_"+w.String()]
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys(pts))
		if err != nil {
			continue
		}
		l.StepStyle = plotter.PreStep
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("W=%s: %.0f applies", w, pts[len(pts)-1].V), l)
	}
	p.Legend.Top, p.Legend.Left = false, false
	last := float64(n/rolloutBatch) * rolloutEvery.Seconds()
	mark, err := plotter.NewLine(plotter.XYs{{X: last, Y: 0}, {X: last, Y: p.Y.Max}})
	if err == nil {
		mark.Color = palette[3]
		mark.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(mark)
		p.Legend.Add("last slice write", mark)
	}
	return p
}

func (b *bench) latencyMs() plotter.Values {
	v := make(plotter.Values, len(b.res.Latencies))
	for i, s := range b.res.Latencies {
		v[i] = s * 1000
	}
	return v
}

func (b *bench) latencyHist() *plot.Plot {
	v := b.latencyMs()
	s := sortedCopy(v)
	p := newPlot(fmt.Sprintf("Isolated change: EndpointSlice write returned -> seen in Consul (%d samples)", len(v)),
		"milliseconds", "samples")
	h, err := plotter.NewHist(v, 40)
	if err == nil {
		h.FillColor = palette[1]
		h.LineStyle.Color = color.White
		p.Add(h)
	}
	for i, q := range []float64{50, 99} {
		x := percentile(s, q)
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
		if err != nil {
			continue
		}
		l.Color = palette[[]int{2, 0}[i]]
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("p%.0f %.1f ms", q, x), l)
	}
	p.Legend.Left = false
	return p
}

func (b *bench) latencyCDF() *plot.Plot {
	s := sortedCopy(b.latencyMs())
	p := newPlot(fmt.Sprintf("Isolated change latency, cumulative distribution (%d samples)", len(s)),
		"milliseconds (log scale)", "fraction of changes seen in Consul")
	pts := make(plotter.XYs, len(s))
	for i, x := range s {
		pts[i].X, pts[i].Y = max(x, 0.01), float64(i+1)/float64(len(s))
	}
	l, err := plotter.NewLine(pts)
	if err == nil {
		l.StepStyle = plotter.PostStep
		l.Color = palette[1]
		l.Width = vg.Points(2)
		p.Add(l)
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	return p
}

// churnPlot: Raft applies per second during and after the churn, and the
// budget.
func (b *bench) churnPlot() *plot.Plot {
	pts := b.res.Series["churn"]
	p := newPlot(fmt.Sprintf("Churn: %d Services, each asked to change once per second for %s; write budget %g/s",
		b.opts.churnServices, b.opts.churnFor, b.opts.churnBudget), "seconds since the churn started", "Raft applies per second")
	var rate plotter.XYs
	for i := 1; i < len(pts); i++ {
		if dt := pts[i].T - pts[i-1].T; dt > 0 {
			rate = append(rate, plotter.XY{X: pts[i].T, Y: (pts[i].V - pts[i-1].V) / dt})
		}
	}
	if l, err := plotter.NewLine(rate); err == nil {
		l.StepStyle = plotter.PreStep
		l.Color = palette[1]
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add("Raft applies/s", l)
	}
	end := b.opts.churnFor.Seconds()
	if stop := b.res.Series["churn_stop"]; len(stop) > 0 {
		end = stop[0].T // the writers may finish late
	}
	if l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: b.opts.churnBudget}, {X: max(end, p.X.Max), Y: b.opts.churnBudget}}); err == nil {
		l.Color = palette[0]
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("budget", l)
	}
	if l, err := plotter.NewLine(plotter.XYs{{X: end, Y: 0}, {X: end, Y: p.Y.Max}}); err == nil {
		l.Color = palette[3]
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("last change written", l)
	}
	p.Y.Min = 0
	p.Legend.Left = false
	return p
}
