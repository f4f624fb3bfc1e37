package main

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// plotResults draws two panels against concurrent runs (log scale): the
// p50 and p99 run time, and the sidecar's peak RSS.
func plotResults(path string, results []result, o options) error {
	p50, p99, rss := make(plotter.XYs, len(results)), make(plotter.XYs, len(results)), make(plotter.XYs, len(results))
	for i, r := range results {
		x := float64(r.Runs)
		p50[i] = plotter.XY{X: x, Y: r.P50.Seconds()}
		p99[i] = plotter.XY{X: x, Y: r.P99.Seconds()}
		rss[i] = plotter.XY{X: x, Y: r.PeakRSSMiB}
	}
	mode := "not durable"
	if o.durable {
		mode = "durable"
	}
	panel := func(title, ylabel string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "concurrent runs"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		return p
	}
	times := panel(fmt.Sprintf("run time (%d × %s calls, %s)", o.calls, o.latency, mode), "seconds")
	if err := plotutil.AddLinePoints(times, "p50", p50, "p99", p99); err != nil {
		return err
	}
	mem := panel("sidecar peak RSS", "MiB")
	if err := plotutil.AddLinePoints(mem, "RSS", rss); err != nil {
		return err
	}
	img := vgsvg.New(vg.Points(900), vg.Points(360))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4, PadLeft: vg.Millimeter * 2,
		PadRight: vg.Millimeter * 2, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	plots := [][]*plot.Plot{{times, mem}}
	canvases := plot.Align(plots, tiles, dc)
	times.Draw(canvases[0][0])
	mem.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
