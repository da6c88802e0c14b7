package main

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// soakRun is one soak test's samples (integration/soak_test.go,
// KEYLINE_SOAK_OUT): seconds, heap MiB, RSS MiB, goroutines per sample.
type soakRun struct {
	label string
	rows  [][4]float64
}

func readSoak(label, path string) (soakRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return soakRun{}, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return soakRun{}, fmt.Errorf("%s: %w", path, err)
	}
	run := soakRun{label: label}
	for i, r := range recs {
		if i == 0 || len(r) != 4 {
			continue // the header
		}
		var row [4]float64
		for j := range row {
			if row[j], err = strconv.ParseFloat(r[j], 64); err != nil {
				return soakRun{}, fmt.Errorf("%s line %d: %w", path, i+1, err)
			}
		}
		run.rows = append(run.rows, row)
	}
	if len(run.rows) < 2 {
		return soakRun{}, fmt.Errorf("%s: fewer than two samples", path)
	}
	return run, nil
}

var soakColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// soakChart draws heap in use and goroutines over time for each run, one
// panel above the other, into a PNG at out. specs are label=path pairs.
func soakChart(specs []string, out string) error {
	var runs []soakRun
	for _, s := range specs {
		label, path, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("-soak %q: want label=file.csv", s)
		}
		r, err := readSoak(label, path)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	panel := func(title, ylabel string, col int) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "seconds of churn"
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		p.Legend.Top, p.Legend.Left = true, true
		for i, r := range runs {
			xys := make(plotter.XYs, len(r.rows))
			for j, row := range r.rows {
				xys[j] = plotter.XY{X: row[0], Y: row[col]}
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color = soakColors[i%len(soakColors)]
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(r.label, l)
		}
		p.Y.Max *= 1.25 // room for the legend
		p.Add(plotter.NewGrid())
		return p, nil
	}
	heap, err := panel("Broker heap in use after a forced GC, between churn rounds", "heap (MiB)", 1)
	if err != nil {
		return err
	}
	gor, err := panel("Goroutines between churn rounds", "goroutines", 3)
	if err != nil {
		return err
	}
	img := vgimg.New(8*vg.Inch, 7*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4)}
	heap.Draw(tiles.At(dc, 0, 0))
	gor.Draw(tiles.At(dc, 0, 1))
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
