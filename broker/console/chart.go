package console

import (
	"strconv"
	"strings"
)

// Charts are SVG polylines drawn on the server from the sampled history, and
// redrawn by static/console.js from the same JSON (the two draw alike: the
// newest sample at the right edge, one sample per chartStep, the y scale from
// 0 to the largest value shown).

const (
	chartWidth  = 300 // viewBox units: one per sample of five minutes at 1/s
	chartHeight = 60
	chartStep   = 1
)

// chart is one small chart with one or more series.
type chart struct {
	ID, Title, Unit string
	Format          string // how to print values: "rate", "bytes", "int"
	Max             float64
	Series          []series
	Width, Height   int
}

// series is one line of a chart.
type series struct {
	Key    string // the JSON field of a history sample it plots
	Name   string
	Class  string // CSS class: its colour
	Points string // SVG polyline points
	Last   float64
}

// newChart draws the series whose values are given by key, oldest first.
func newChart(id, title, unit, format string, lines []series, values map[string][]float64) chart {
	c := chart{ID: id, Title: title, Unit: unit, Format: format, Width: chartWidth, Height: chartHeight}
	for _, l := range lines {
		for _, v := range values[l.Key] {
			c.Max = max(c.Max, v)
		}
	}
	scale := c.Max
	if scale <= 0 {
		scale = 1
	}
	for _, l := range lines {
		vs := values[l.Key]
		if len(vs) > chartWidth/chartStep+1 {
			vs = vs[len(vs)-chartWidth/chartStep-1:]
		}
		var b strings.Builder
		for i, v := range vs {
			x := float64(chartWidth - (len(vs)-1-i)*chartStep)
			y := chartHeight - 2 - v/scale*(chartHeight-4)
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.FormatFloat(x, 'f', 0, 64))
			b.WriteByte(',')
			b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
		}
		l.Points = b.String()
		if len(vs) > 0 {
			l.Last = vs[len(vs)-1]
		}
		c.Series = append(c.Series, l)
	}
	return c
}

// Label prints v as the chart's values are printed.
func (c chart) Label(v float64) string {
	switch c.Format {
	case "bytes":
		return byteSize(v) + "/s"
	case "int":
		return num(v)
	}
	return rate(v)
}
