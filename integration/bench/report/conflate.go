package main

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// keptMarker starts the part of BENCHMARKS.md written by hand (measured by
// other tools); report keeps it, below what it writes.
const keptMarker = "<!-- Sections below this line are written by hand: integration/bench/report keeps them. -->"

// keptSections returns the hand-written tail of the markdown file at path
// (from keptMarker on), or "" when there is none.
func keptSections(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.Index(s, keptMarker)
	if i < 0 {
		return ""
	}
	return "\n" + s[i:]
}

func rssGrowth(r *rec) float64 { return float64(r.RSS.MaxKB - r.RSS.StartKB) }

// growthRatio is ratio for RSS growth, which means nothing against a base
// below 1 MiB (a broker that grew by nothing measurable).
func growthRatio(v, base float64) string {
	if base < 1024 {
		return "-"
	}
	return ratio(v, base)
}

// finalDelay is how long after publishing stopped the last value of every
// topic reached the reader; NaN when some never did.
func finalDelay(r *rec) float64 {
	if r.Conflate.FinalDelayMS < 0 {
		return math.NaN()
	}
	return r.Conflate.FinalDelayMS
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "not all"
	}
	return fmt.Sprintf("%.2f s", v/1000)
}

// writeConflate writes the conflation section.
func writeConflate(w *strings.Builder, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var cases []string
	for _, cs := range t.cases {
		if caseKind(t, cs) == "conflate" {
			cases = append(cases, cs)
		}
	}
	if len(cases) == 0 {
		return
	}
	p("## Slow reader of many topics: conflation\n\n")
	p("One publisher cycles over many topics at a fixed rate; one reader subscribed to all of them reads a fixed number\n")
	p("of bytes per second, far less than is published, with a 4 KiB socket buffer so the backlog stays in the broker.\n")
	p("Keyline runs these cases with `--slow-policy conflate`: the reader's queue keeps the newest message of each topic\n")
	p("(in the place of the first queued), so what it reads is fresh and the last value of every topic arrives soon\n")
	p("after publishing stops. A broker that queues everything hands the reader an ever older backlog. `age` is the time\n")
	p("from publish to the reader's read, over values read in the measured window; `last values` is when, after the\n")
	p("publisher stopped, the reader held the last published value of every topic (`not all`: some were still missing\n")
	p("at the end of the drain).\n\n")
	p("| case | broker | topics | published msg/s | reader msg/s | age p50 | age p99 | age max | topics read | last values after stop | RSS max |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, cs := range cases {
		for _, b := range t.brokers {
			c := t.get(cs, b)
			topics := c.median(func(r *rec) float64 { return float64(r.Conflate.Topics) })
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cs, b, integer(topics),
				num(c.median(func(r *rec) float64 { return r.PublishedPerS })),
				num(c.median(func(r *rec) float64 { return r.DeliveredPerS })),
				us(c.median(func(r *rec) float64 { return r.Latency.P50 })),
				us(c.median(func(r *rec) float64 { return r.Latency.P99 })),
				us(c.median(func(r *rec) float64 { return r.Latency.Max })),
				integer(c.median(func(r *rec) float64 { return float64(r.Conflate.TopicsReceived) })),
				ms(c.median(finalDelay)),
				mib(c.median(func(r *rec) float64 { return float64(r.RSS.MaxKB) })))
		}
	}
	p("\n")
}
