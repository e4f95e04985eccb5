package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// report prints one line per figure and writes result.json and
// timeline.png into the out dir.
func report(res *result, o options, out io.Writer) error {
	p := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	p("seed: %d", res.Seed)
	p("run: %.0fs, Services alpha %d beta %d, %d alpha replicas --shards %d, %d Consul servers",
		res.DurationS, res.Services["alpha"], res.Services["beta"], res.Replicas, res.Shards, res.ConsulServers)
	p("cold start: %.1fs to exact", res.ColdStartS)
	kinds := slices.Sorted(func(yield func(string) bool) {
		for k := range res.Faults {
			if !yield(k) {
				return
			}
		}
	})
	total := 0
	for _, k := range kinds {
		total += res.Faults[k]
	}
	p("faults injected: %d", total)
	for _, k := range kinds {
		p("  fault %-26s %d", k, res.Faults[k])
	}
	p("worst missing instance per fault overlapping it (none: plain propagation); bound after heal %.0fs:", res.BoundS)
	for _, k := range gapKinds(res.Gaps) {
		g := res.Gaps[k]
		p("  missing %-26s %6.2fs  (%d streaks; worst %s)", k, g.Worst, g.Count, g.Object)
	}
	for _, k := range gapKinds(res.StaleGaps) {
		g := res.StaleGaps[k]
		p("  stale   %-26s %6.2fs  (%d streaks; worst %s)", k, g.Worst, g.Count, g.Object)
	}
	p("time to exact after the last fault healed: %.2fs", res.TimeToExactS)
	p("changes to the desired state: %d (Kubernetes writes %d, %d failed)", res.Changes, res.KubeWrites, res.KubeFailed)
	p("fleetsync transactions: %d, %.2f per change (repairs after faults included)", res.Txns, res.TxnsPerChange)
	p("idle: %d transactions in %.0fs", res.IdleTxns, res.IdleS)
	p("checker samples: %d (%d could not read Kubernetes or Consul)", res.Samples, res.FailedReads)
	p("violations: %d", len(res.Violations))
	for _, v := range res.Violations {
		p("  VIOLATION %s at %.1fs fault=%s %s: %s", v.Rule, v.At, v.Fault, v.Object, v.Detail)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	png := filepath.Join(o.out, "timeline.png")
	if err := timeline(res, png); err != nil {
		return err
	}
	res.Plot = png
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(o.out, "result.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	p("json: %s", path)
	p("plot: %s", png)
	return nil
}

func gapKinds(m map[string]*gapStat) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// timeline plots the missing and stale instances and the transactions per
// second over the run, with a mark per fault.
func timeline(res *result, path string) error {
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("fleetsync soak, seed %d: live-instance deficit and transactions, faults marked", res.Seed)
	pl.X.Label.Text = "seconds"
	pl.Y.Label.Text = "instances / transactions per second"
	var miss, extra, rate plotter.XYs
	var prev *point
	for i := range res.Timeline {
		pt := &res.Timeline[i]
		if pt.OK {
			miss = append(miss, plotter.XY{X: pt.T, Y: float64(pt.Missing)})
			extra = append(extra, plotter.XY{X: pt.T, Y: float64(pt.Extra)})
		}
		if prev != nil && pt.T > prev.T {
			rate = append(rate, plotter.XY{X: pt.T, Y: float64(pt.Txns-prev.Txns) / (pt.T - prev.T)})
		}
		prev = pt
	}
	maxY := 1.0
	for _, s := range []plotter.XYs{miss, extra, rate} {
		for _, xy := range s {
			maxY = max(maxY, xy.Y)
		}
	}
	add := func(xys plotter.XYs, name string, c color.Color) error {
		if len(xys) == 0 {
			return nil
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color = c
		pl.Add(l)
		pl.Legend.Add(name, l)
		return nil
	}
	if err := add(miss, "missing instances", color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}); err != nil {
		return err
	}
	if err := add(extra, "stale instances", color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}); err != nil {
		return err
	}
	if err := add(rate, "fleetsync txns/s", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}); err != nil {
		return err
	}
	var labels plotter.XYLabels
	for i, f := range res.FaultLog {
		end := f.EndS
		if end < f.StartS {
			end = f.StartS
		}
		band, err := plotter.NewLine(plotter.XYs{{X: f.StartS, Y: maxY * 1.05}, {X: end, Y: maxY * 1.05}})
		if err != nil {
			return err
		}
		band.Color = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
		band.Width = vg.Points(4)
		pl.Add(band)
		mark, err := plotter.NewLine(plotter.XYs{{X: f.StartS, Y: 0}, {X: f.StartS, Y: maxY * 1.05}})
		if err != nil {
			return err
		}
		mark.Color = color.RGBA{R: 0xbb, G: 0xbb, B: 0xbb, A: 0xff}
		mark.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		pl.Add(mark)
		labels.XYs = append(labels.XYs, plotter.XY{X: f.StartS, Y: maxY * (1.08 + 0.04*float64(i%4))})
		labels.Labels = append(labels.Labels, f.Kind)
	}
	if len(labels.XYs) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(6)
		}
		pl.Add(l)
	}
	pl.Y.Max = maxY * 1.3
	pl.Legend.Top = true
	return pl.Save(14*vg.Inch, 5*vg.Inch, path)
}
