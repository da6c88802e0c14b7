// Command report turns the benchmark script's raw results (one loadgen JSON
// line per run) into BENCHMARKS.md and PNG charts: medians per case and
// broker, ratios to mosquitto, the load generator's CPU share, and the
// order checker's findings.
//
//	report -results results.jsonl -meta meta.tsv -md BENCHMARKS.md -charts integration/bench/charts
//	report -summary < one-line.json     (one human line, for progress logs)
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// rec mirrors the fields of loadgen's JSON line that the report uses.
type rec struct {
	Scenario  string   `json:"scenario"`
	Label     string   `json:"label"`
	Tag       string   `json:"tag"`
	Round     int      `json:"round"`
	Args      []string `json:"args"`
	OK        bool     `json:"ok"`
	Errors    []string `json:"errors"`
	Proto     int      `json:"proto"`
	QoS       int      `json:"qos"`
	Payload   int      `json:"payload"`
	Pubs      int      `json:"publishers"`
	Subs      int      `json:"subscribers"`
	Stalled   int      `json:"stalled"`
	Consumers int      `json:"consumers"`
	KeyMode   string   `json:"key_mode"`
	Rate      float64  `json:"rate"`
	Ahead     int      `json:"ahead"`

	Published      uint64  `json:"published"`
	PublishedPerS  float64 `json:"published_per_s"`
	Delivered      uint64  `json:"delivered"`
	DeliveredPerS  float64 `json:"delivered_per_s"`
	Expected       uint64  `json:"expected"`
	DeliveredRatio float64 `json:"delivered_ratio"`
	Latency        struct {
		Count uint64  `json:"count"`
		P50   float64 `json:"p50"`
		P90   float64 `json:"p90"`
		P99   float64 `json:"p99"`
		P999  float64 `json:"p999"`
		Max   float64 `json:"max"`
	} `json:"latency_us"`
	Gaps           uint64 `json:"gaps"`
	Reorders       uint64 `json:"reorders"`
	PublishedAll   uint64 `json:"published_all"`
	DeliveredAll   uint64 `json:"delivered_all"`
	KeyPropMissing uint64 `json:"key_prop_missing"`
	Order          *struct {
		Keys                   int    `json:"keys"`
		Unique                 uint64 `json:"unique"`
		Duplicates             uint64 `json:"duplicates"`
		Missing                uint64 `json:"missing"`
		OrderViolations        uint64 `json:"order_violations"`
		KeysWithViolations     int    `json:"keys_with_violations"`
		KeysOnSeveralConsumers int    `json:"keys_on_several_consumers"`
	} `json:"order"`
	MsgsPerConsumer []uint64 `json:"msgs_per_consumer"`
	CPU             struct {
		Loadgen         float64 `json:"loadgen_cores"`
		Broker          float64 `json:"broker_cores"`
		Machine         float64 `json:"machine_busy_cores"`
		Other           float64 `json:"other_cores"`
		LoadgenShare    float64 `json:"loadgen_share"`
		LoadgenUsPerMsg float64 `json:"loadgen_us_per_msg"`
		BrokerUsPerMsg  float64 `json:"broker_us_per_msg"`
	} `json:"cpu"`
	RSS *struct {
		StartKB int64      `json:"start_kb"`
		MaxKB   int64      `json:"max_kb"`
		EndKB   int64      `json:"end_kb"`
		Series  [][2]int64 `json:"series"`
	} `json:"broker_rss"`
	Connections *struct {
		Requested    int     `json:"requested"`
		Opened       int     `json:"opened"`
		Failed       int     `json:"failed"`
		ConnectS     float64 `json:"connect_s"`
		ConnectPerS  float64 `json:"connect_per_s"`
		Alive        int     `json:"alive"`
		RSSBeforeKB  int64   `json:"rss_before_kb"`
		RSSAfterKB   int64   `json:"rss_after_kb"`
		RSSPerConnKB float64 `json:"rss_per_conn_kb"`
		FDLimit      int     `json:"fd_limit"`
		Subscribed   bool    `json:"subscribed"`
		UsPerConn    float64 `json:"broker_us_per_conn"`
		Go           *goCost `json:"go"`
	} `json:"connections"`
	Conflate *struct {
		Topics         int     `json:"topics"`
		ReadRate       int     `json:"read_rate_bytes_per_s"`
		TopicsReceived int     `json:"topics_received"`
		FinalValues    int     `json:"final_values"`
		FinalDelayMS   float64 `json:"final_delay_ms"`
	} `json:"conflate"`
	Stall *struct {
		Readers        int     `json:"readers"`
		Published      uint64  `json:"published"`
		Received       uint64  `json:"received"`
		Missing        uint64  `json:"missing"`
		FirstLossAfter uint64  `json:"first_loss_after"`
		DrainS         float64 `json:"drain_s"`
	} `json:"stalled_readers"`
	// loadgen probe lines (scenario "probe")
	SyscallNS float64 `json:"syscall_ns"`
	Fdatasync *struct {
		P50 float64 `json:"p50"`
		P90 float64 `json:"p90"`
		P99 float64 `json:"p99"`
	} `json:"fdatasync_us"`
	WriteBytes int     `json:"write_bytes"`
	Inflight   int     `json:"inflight"`
	FsyncBound float64 `json:"fsync_bound_per_s"`
	Sessions   *struct {
		Requested       int     `json:"requested"`
		Stored          int     `json:"stored"`
		CreateS         float64 `json:"create_s"`
		Checked         int     `json:"checked"`
		Present         int     `json:"present"`
		RSSBeforeKB     int64   `json:"rss_before_kb"`
		RSSAfterKB      int64   `json:"rss_after_kb"`
		RSSPerSessionKB float64 `json:"rss_per_session_kb"`
		Go              *goCost `json:"go"`
	} `json:"sessions"`
	Wake *struct {
		Opened         int     `json:"opened"`
		PeriodS        float64 `json:"period_s"`
		WindowS        float64 `json:"window_s"`
		Published      uint64  `json:"published"`
		Acked          uint64  `json:"acked"`
		BrokerCPUS     float64 `json:"broker_cpu_s"`
		BrokerUsPerMsg float64 `json:"broker_us_per_msg"`
		AckLatency     struct {
			P50 float64 `json:"p50"`
			P99 float64 `json:"p99"`
		} `json:"ack_latency_us"`
		RSSAfterKB int64 `json:"rss_after_kb"`
	} `json:"wake"`
}

// goCost is what each connection or session cost a Go broker (loadgen -broker-pprof).
type goCost struct {
	HeapKB     float64 `json:"heap_kb"`
	StackKB    float64 `json:"stack_kb"`
	Goroutines float64 `json:"goroutines"`
}

type meta struct {
	kv        map[string]string
	cases     [][2]string       // name, args
	caseFlags map[string]string // name -> keyline flags of that case
	caseMosq  map[string]string // name -> mosquitto settings of that case (';'-separated)
	brokerCmd [][2]string
	brokers   []string
}

func main() {
	results := flag.String("results", "", "results.jsonl from integration/bench/run")
	metaPath := flag.String("meta", "", "meta.tsv from integration/bench/run")
	md := flag.String("md", "BENCHMARKS.md", "markdown file to write")
	charts := flag.String("charts", "integration/bench/charts", "directory for the PNG charts")
	summary := flag.Bool("summary", false, "print a one-line summary of the loadgen JSON on stdin")
	soak := flag.String("soak", "", "label=file.csv[,label=file.csv...]: draw the soak test's samples (KEYLINE_SOAK_OUT) into -soak-chart")
	soakOut := flag.String("soak-chart", "integration/bench/charts/soak.png", "PNG the -soak chart is written to")
	flag.Parse()
	if *soak != "" {
		if err := soakChart(strings.Split(*soak, ","), *soakOut); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
		return
	}
	if *summary {
		b, _ := io.ReadAll(os.Stdin)
		var r rec
		if err := json.Unmarshal(b, &r); err != nil {
			fmt.Println("(no result)")
			return
		}
		fmt.Println(oneLine(&r))
		return
	}
	if err := run(*results, *metaPath, *md, *charts); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func oneLine(r *rec) string {
	if !r.OK {
		return "FAILED " + strings.Join(r.Errors, "; ")
	}
	switch {
	case r.Scenario == "probe":
		if r.Fdatasync == nil {
			return "probe without fdatasync figures"
		}
		return fmt.Sprintf("syscall %.0f ns, write %d B + fdatasync p50 %s p99 %s, fsync bound for %d in flight %s msg/s",
			r.SyscallNS, r.WriteBytes, us(r.Fdatasync.P50), us(r.Fdatasync.P99), r.Inflight, num(r.FsyncBound))
	case r.Connections != nil:
		c := r.Connections
		return fmt.Sprintf("%d conns, %.0f/s, %.0f µs CPU/conn, %.1f KiB/conn, alive %d", c.Opened, c.ConnectPerS, c.UsPerConn, c.RSSPerConnKB, c.Alive)
	case r.Sessions != nil:
		s := r.Sessions
		return fmt.Sprintf("%d offline sessions, %.1f KiB/session, %d of %d kept", s.Stored, s.RSSPerSessionKB, s.Present, s.Checked)
	case r.Wake != nil:
		w := r.Wake
		return fmt.Sprintf("%d conns, %d of %d acked, broker %.2f s CPU (%.0f µs/msg)", w.Opened, w.Acked, w.Published, w.BrokerCPUS, w.BrokerUsPerMsg)
	default:
		s := fmt.Sprintf("%.0f delivered/s (%.3f of expected), p50 %s p99 %s, loadgen %.2f cores, broker %.2f, other %.2f",
			r.DeliveredPerS, r.DeliveredRatio, us(r.Latency.P50), us(r.Latency.P99), r.CPU.Loadgen, r.CPU.Broker, r.CPU.Other)
		if r.Order != nil {
			s += fmt.Sprintf(", order violations %d, dups %d, missing %d", r.Order.OrderViolations, r.Order.Duplicates, r.Order.Missing)
		}
		if r.RSS != nil && r.Stalled > 0 {
			s += fmt.Sprintf(", RSS max %.1f MiB (+%.1f)", float64(r.RSS.MaxKB)/1024, rssGrowth(r)/1024)
		}
		if st := r.Stall; st != nil {
			s += fmt.Sprintf(", stalled reader held %d of %d (first loss after %d)", st.Received, st.Published, st.FirstLossAfter)
		}
		if c := r.Conflate; c != nil {
			s += fmt.Sprintf(", last values of %d/%d topics, after %s", c.FinalValues, c.Topics, ms(finalDelay(r)))
		}
		return s
	}
}

func readMeta(path string) (*meta, error) {
	m := &meta{kv: map[string]string{}, caseFlags: map[string]string{}, caseMosq: map[string]string{}}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), "\t")
		switch {
		case len(parts) == 3 && parts[0] == "case":
			m.cases = append(m.cases, [2]string{parts[1], parts[2]})
		case len(parts) == 3 && parts[0] == "case_flags":
			m.caseFlags[parts[1]] = parts[2]
		case len(parts) == 3 && parts[0] == "case_mosquitto":
			m.caseMosq[parts[1]] = parts[2]
		case len(parts) == 3 && parts[0] == "broker_cmd":
			m.brokerCmd = append(m.brokerCmd, [2]string{parts[1], parts[2]})
		case len(parts) >= 2:
			m.kv[parts[0]] = strings.Join(parts[1:], "\t")
		}
	}
	m.brokers = strings.Fields(m.kv["brokers"])
	return m, sc.Err()
}

func readResults(path string) ([]*rec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*rec
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r rec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, &r)
	}
	return out, sc.Err()
}

// runs of one case on one broker, in round order
type cell []*rec

func (c cell) ok() cell {
	var o cell
	for _, r := range c {
		if r.OK {
			o = append(o, r)
		}
	}
	return o
}

// safe evaluates f on r, NaN where a field is missing (a nil section).
func safe(f func(*rec) float64, r *rec) (v float64) {
	defer func() {
		if recover() != nil {
			v = math.NaN()
		}
	}()
	return f(r)
}

func (c cell) median(f func(*rec) float64) float64 {
	var v []float64
	for _, r := range c.ok() {
		if x := safe(f, r); !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func (c cell) all(f func(*rec) float64, format func(float64) string) string {
	var s []string
	for _, r := range c {
		if !r.OK {
			s = append(s, "fail")
			continue
		}
		s = append(s, format(safe(f, r)))
	}
	return strings.Join(s, ", ")
}

// medianRec returns the run whose f is the median (for series charts).
func (c cell) medianRec(f func(*rec) float64) *rec {
	var ok cell
	for _, r := range c.ok() {
		if !math.IsNaN(safe(f, r)) {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	sort.Slice(ok, func(i, j int) bool { return f(ok[i]) < f(ok[j]) })
	return ok[(len(ok)-1)/2]
}

type table struct {
	cases   []string
	brokers []string
	cells   map[[2]string]cell
	args    map[string]string
	// resultsRel is the raw results file relative to the markdown file.
	resultsRel string
}

func (t *table) get(cs, b string) cell { return t.cells[[2]string{cs, b}] }

func kind(c cell) string {
	if len(c) == 0 {
		return ""
	}
	r := c[0]
	switch {
	case r.Scenario == "connections":
		return "connections"
	case r.Scenario == "sessions":
		return "sessions"
	case r.Scenario == "wake":
		return "wake"
	case r.Scenario == "shared":
		return "shared"
	case r.Scenario == "conflate":
		return "conflate"
	case r.Scenario == "slowsub" || r.Stalled > 0:
		return "slowsub"
	case r.Rate > 0:
		return "latency"
	default:
		return "throughput"
	}
}

func run(resultsPath, metaPath, mdPath, chartDir string) error {
	if resultsPath == "" || metaPath == "" {
		return errors.New("-results and -meta are required")
	}
	m, err := readMeta(metaPath)
	if err != nil {
		return err
	}
	recs, err := readResults(resultsPath)
	if err != nil {
		return err
	}
	t := &table{cells: map[[2]string]cell{}, args: map[string]string{}}
	for _, c := range m.cases {
		t.cases = append(t.cases, c[0])
		t.args[c[0]] = c[1]
	}
	// Brokers in report order: the baseline first.
	for _, b := range []string{"mosquitto", "mochi", "keyline"} {
		for _, have := range m.brokers {
			if have == b {
				t.brokers = append(t.brokers, b)
			}
		}
	}
	for _, r := range recs {
		k := [2]string{r.Tag, r.Label}
		t.cells[k] = append(t.cells[k], r)
	}
	for _, c := range t.cells {
		sort.Slice(c, func(i, j int) bool { return c[i].Round < c[j].Round })
	}
	if err := os.MkdirAll(chartDir, 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(mustAbs(mdPath)), mustAbs(chartDir))
	if err != nil {
		rel = chartDir
	}
	t.resultsRel, err = filepath.Rel(filepath.Dir(mustAbs(mdPath)), mustAbs(resultsPath))
	if err != nil {
		t.resultsRel = resultsPath
	}
	charts, err := drawCharts(t, chartDir, rel)
	if err != nil {
		return err
	}
	var b strings.Builder
	writeMarkdown(&b, m, t, recs, charts)
	b.WriteString(manualSections(mdPath))
	return os.WriteFile(mdPath, []byte(b.String()), 0o644)
}

// manualMarker starts the part of BENCHMARKS.md written by hand (figures
// measured outside integration/bench/run); a new report keeps it as it is.
const manualMarker = "<!-- Sections below are measured by hand; integration/bench/run keeps them as they are. -->"

// manualSections returns the hand-written tail of the report at path, from
// manualMarker on, or "" when there is none.
func manualSections(path string) string {
	old, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	i := strings.Index(string(old), manualMarker)
	if i < 0 {
		return ""
	}
	return "\n" + string(old[i:])
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// ---------------------------------------------------------------- formatting

func us(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v >= 1e6:
		return fmt.Sprintf("%.2f s", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1f ms", v/1e3)
	default:
		return fmt.Sprintf("%.0f µs", v)
	}
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func f2(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func f3(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", v)
}

func mib(kb float64) string {
	if math.IsNaN(kb) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", kb/1024)
}

func ratio(v, base float64) string {
	if math.IsNaN(v) || math.IsNaN(base) || base == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", v/base)
}

func integer(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", v)
}

// headline is the one metric per case in the summary table.
type headline struct {
	name   string
	f      func(*rec) float64
	format func(float64) string
	better string // "higher" or "lower"
	counts bool   // a count where a ratio means nothing (order violations)
}

func headlines(k string) []headline {
	switch k {
	case "throughput":
		return []headline{{"delivered msg/s", func(r *rec) float64 { return r.DeliveredPerS }, num, "higher", false}}
	case "latency":
		return []headline{
			{"p50 latency", func(r *rec) float64 { return r.Latency.P50 }, us, "lower", false},
			{"p99 latency", func(r *rec) float64 { return r.Latency.P99 }, us, "lower", false},
		}
	case "shared":
		return []headline{
			{"delivered msg/s", func(r *rec) float64 { return r.DeliveredPerS }, num, "higher", false},
			{"per-key order violations", func(r *rec) float64 { return float64(r.Order.OrderViolations) }, integer, "lower", true},
		}
	case "slowsub":
		return []headline{
			{"readers' msg/s", func(r *rec) float64 { return r.DeliveredPerS }, num, "higher", false},
			{"broker RSS max", func(r *rec) float64 { return float64(r.RSS.MaxKB) }, mib, "lower", false},
			{"broker RSS growth", rssGrowth, mib, "lower", false},
		}
	case "conflate":
		return []headline{
			{"age of values read, p99", func(r *rec) float64 { return r.Latency.P99 }, us, "lower", false},
			{"last value of every topic, after stop", finalDelay, ms, "lower", false},
		}
	case "connections":
		return []headline{
			{"connects/s", func(r *rec) float64 { return r.Connections.ConnectPerS }, num, "higher", false},
			{"RSS per connection", func(r *rec) float64 { return r.Connections.RSSPerConnKB }, func(v float64) string { return fmt.Sprintf("%.1f KiB", v) }, "lower", false},
		}
	case "sessions":
		return []headline{
			{"RSS per offline session", func(r *rec) float64 { return r.Sessions.RSSPerSessionKB }, func(v float64) string { return fmt.Sprintf("%.1f KiB", v) }, "lower", false},
		}
	case "wake":
		return []headline{
			{"broker CPU per message", func(r *rec) float64 { return r.Wake.BrokerUsPerMsg }, func(v float64) string { return fmt.Sprintf("%.0f µs", v) }, "lower", false},
		}
	}
	return nil
}

func caseKind(t *table, cs string) string {
	for _, b := range t.brokers {
		if c := t.get(cs, b); len(c) > 0 {
			return kind(c)
		}
	}
	return ""
}

func writeMarkdown(w *strings.Builder, m *meta, t *table, recs []*rec, charts []string) {
	kv := m.kv
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Keyline benchmarks\n\n")
	p("Keyline beside [mosquitto](https://mosquitto.org/) and plain [mochi-mqtt](https://github.com/mochi-mqtt/server) on one machine, over loopback.\n")
	p("Everything here was produced by one command, `integration/bench/run%s`, which builds the brokers and the load generator,\n", map[bool]string{true: " --quick", false: ""}[kv["quick"] == "1"])
	p("runs every case against every broker in turn, %s round(s), and wrote this file, the charts and the raw results\n", kv["rounds"])
	p("(`%s`, one loadgen JSON line per run). Every number below is a median over the rounds\n", t.resultsRel)
	p("of a field of those lines; the command for each case is listed under [Commands](#commands).\n\n")

	p("## How to run\n\n```\n")
	p("integration/bench/run             # full: %s rounds, about 35 min; rewrites BENCHMARKS.md, integration/bench/charts/\n", "3")
	p("                                  # and integration/bench/results.jsonl\n")
	p("integration/bench/run --quick     # smoke test under 2 min, output in a temp dir; exits non-zero if a broker\n")
	p("                                  # does not start or a run fails\n")
	p("integration/bench/run --brokers \"keyline mosquitto\" --cases \"shared-prop shared-topic\" --rounds 5\n")
	p("integration/bench/run --keyline-rev HEAD   # build keyline from a commit (clean export), not the work tree\n")
	p("KEYLINE_BIN=/path/to/keyline integration/bench/run     # benchmark a prebuilt binary\n")
	p("go run ./integration/loadgen -addr 127.0.0.1:1883 -scenario shared -consumers 8 -keys 64   # one run, any broker\n")
	p("```\n\n")
	p("It needs Linux (`/proc`), Go, and mosquitto (`apt-get install mosquitto` is run if it is missing). All traffic\n")
	p("stays on 127.0.0.1. `loadgen -h` lists every knob; each run prints one JSON line. Every connection comes from\n")
	p("127.0.0.1, so `run` starts keyline with `--connect-rate-per-address 0` (the default, 100 a second past a burst of\n")
	p("1,000, would hold back the 10,000-connection cases); do the same for a keyline you point loadgen at.\n\n")
	p("## Machine\n\n")
	p("| | |\n|---|---|\n")
	for _, k := range [][2]string{{"date", "date"}, {"cpu", "CPU"}, {"nproc", "cores (nproc)"}, {"memory", "memory"}, {"kernel", "kernel"},
		{"fd_limit", "open files limit"}, {"go", "Go"}, {"mosquitto", "mosquitto"}, {"mochi", "mochi-mqtt/server"}, {"keyline", "Keyline"}, {"elapsed_s", "run time (s)"}} {
		p("| %s | %s |\n", k[1], kv[k[0]])
	}
	writeProbe(w, t)
	p("\nThe machine is shared with other work, which takes CPU during runs: the `other` column in the CPU tables is the\n")
	p("machine's busy time minus the load generator and the broker (from `/proc/stat`), so noisy runs can be recognised.\n\n")

	// -------- summary
	p("## Summary: medians and ratios to mosquitto\n\n")
	p("Ratios are broker / mosquitto; for throughput higher is better, for latency, violations and memory lower is better.\n\n")
	p("| case | metric | %s |\n|---|---|%s\n", strings.Join(t.brokers, " | "), strings.Repeat("---|", len(t.brokers)))
	for _, cs := range t.cases {
		k := caseKind(t, cs)
		for _, h := range headlines(k) {
			base := t.get(cs, "mosquitto").median(h.f)
			var cols []string
			for _, b := range t.brokers {
				v := t.get(cs, b).median(h.f)
				s := h.format(v)
				if b != "mosquitto" && !h.counts && !math.IsNaN(base) && base != 0 && (h.name != "broker RSS growth" || base >= 1024) {
					s += " (" + ratio(v, base) + ")"
				}
				cols = append(cols, s)
			}
			p("| %s | %s | %s |\n", cs, h.name, strings.Join(cols, " | "))
		}
	}
	p("\n")
	for _, c := range charts {
		p("%s\n\n", c)
	}

	// -------- detail tables
	p("## Throughput (flood, QoS as listed)\n\n")
	p("Publishers send as fast as they may while staying at most `ahead` messages in front of their slowest subscriber\n")
	p("(`-ahead`, default 100), so the figure is sustained delivery, not queue filling. Latency here is mostly that\n")
	p("window's queueing; see the paced case for latency. `delivered/expected` counts messages sent in the window that\n")
	p("arrived by the end of the drain; `gaps` are lost messages seen as sequence gaps.\n\n")
	p("| case | broker | delivered msg/s | vs mosquitto | published msg/s | delivered/expected | gaps | p50 | p99 | rounds (delivered msg/s) |\n")
	p("|---|---|---|---|---|---|---|---|---|---|\n")
	forKind(t, "throughput", func(r *rec) float64 { return r.DeliveredPerS }, func(cs, b string, c cell, base float64) {
		d := c.median(func(r *rec) float64 { return r.DeliveredPerS })
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cs, b, num(d), ratio(d, base),
			num(c.median(func(r *rec) float64 { return r.PublishedPerS })),
			f3(c.median(func(r *rec) float64 { return r.DeliveredRatio })),
			integer(c.median(func(r *rec) float64 { return float64(r.Gaps) })),
			us(c.median(func(r *rec) float64 { return r.Latency.P50 })),
			us(c.median(func(r *rec) float64 { return r.Latency.P99 })),
			c.all(func(r *rec) float64 { return r.DeliveredPerS }, num))
	})
	p("\n")

	p("## Latency at a fixed rate\n\n")
	p("From the send time the publisher stamps into each payload just before its `write()` to the subscriber's read of it.\n\n")
	p("| case | broker | delivered msg/s | p50 | p90 | p99 | p99.9 | max | p99 vs mosquitto | delivered/expected |\n")
	p("|---|---|---|---|---|---|---|---|---|---|\n")
	forKind(t, "latency", func(r *rec) float64 { return r.Latency.P99 }, func(cs, b string, c cell, base float64) {
		p99 := c.median(func(r *rec) float64 { return r.Latency.P99 })
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cs, b,
			num(c.median(func(r *rec) float64 { return r.DeliveredPerS })),
			us(c.median(func(r *rec) float64 { return r.Latency.P50 })),
			us(c.median(func(r *rec) float64 { return r.Latency.P90 })),
			us(p99),
			us(c.median(func(r *rec) float64 { return r.Latency.P999 })),
			us(c.median(func(r *rec) float64 { return r.Latency.Max })),
			ratio(p99, base),
			f3(c.median(func(r *rec) float64 { return r.DeliveredRatio })))
	})
	p("\n")

	p("## Shared subscriptions: per-key order\n\n")
	p("A `$share` group of consumers; publishers pick keys at random and number each key's messages. Each consumer\n")
	p("records a message before it sends the PUBACK. A message is an **order violation** when a later sequence number of\n")
	p("its key was already processed by any consumer, a **duplicate** when its (key, sequence) was already processed;\n")
	p("**missing** = published - unique processed. `keys on >1 consumer` counts keys whose messages went to more than one\n")
	p("consumer (0 with Key-Shared dispatch, all keys with round-robin). QoS 1 both ways.\n\n")
	p("| case | broker | delivered msg/s | vs mosquitto | order violations (median) | per round | keys with violations | duplicates | missing | keys on >1 consumer | p50 | p99 |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	forKind(t, "shared", func(r *rec) float64 { return r.DeliveredPerS }, func(cs, b string, c cell, base float64) {
		d := c.median(func(r *rec) float64 { return r.DeliveredPerS })
		keys := 0
		if ok := c.ok(); len(ok) > 0 && ok[0].Order != nil {
			keys = ok[0].Order.Keys
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s of %d | %s | %s |\n", cs, b, num(d), ratio(d, base),
			integer(c.median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })),
			c.all(func(r *rec) float64 { return float64(r.Order.OrderViolations) }, integer),
			integer(c.median(func(r *rec) float64 { return float64(r.Order.KeysWithViolations) })),
			integer(c.median(func(r *rec) float64 { return float64(r.Order.Duplicates) })),
			integer(c.median(func(r *rec) float64 { return float64(r.Order.Missing) })),
			integer(c.median(func(r *rec) float64 { return float64(r.Order.KeysOnSeveralConsumers) })), keys,
			us(c.median(func(r *rec) float64 { return r.Latency.P50 })),
			us(c.median(func(r *rec) float64 { return r.Latency.P99 })))
	})
	p("\n")
	writeOrderFindings(w, t)
	writeDurable(w, m, t)

	p("## Slow subscriber\n\n")
	p("One subscriber stops reading its socket (its receive buffer is 4 KiB, so the backlog sits in the broker); the\n")
	p("others read normally while a publisher paces at the target rate, held as everywhere within `ahead` messages of\n")
	p("the slowest *reading* subscriber. A broker that isolates the slow reader keeps the publisher at the target, the\n")
	p("readers' latency low and its own memory bounded; `published < target` means the broker could not deliver the\n")
	p("target rate to the readers while one reader was stalled (or, with high `other cores`, lacked CPU).\n\n")
	p("| case | broker | QoS | target msg/s | published msg/s | readers' msg/s | delivered/expected | p50 | p99 | RSS start | RSS max | RSS max vs mosquitto | RSS growth | growth vs mosquitto |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, cs := range t.cases {
		if caseKind(t, cs) != "slowsub" {
			continue
		}
		base := t.get(cs, "mosquitto").median(func(r *rec) float64 { return float64(r.RSS.MaxKB) })
		baseGrowth := t.get(cs, "mosquitto").median(rssGrowth)
		for _, b := range t.brokers {
			c := t.get(cs, b)
			rss := c.median(func(r *rec) float64 { return float64(r.RSS.MaxKB) })
			growth := c.median(rssGrowth)
			rate, qos := math.NaN(), "n/a"
			if ok := c.ok(); len(ok) > 0 {
				rate, qos = ok[0].Rate, strconv.Itoa(ok[0].QoS)
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cs, b, qos, num(rate),
				num(c.median(func(r *rec) float64 { return r.PublishedPerS })),
				num(c.median(func(r *rec) float64 { return r.DeliveredPerS })),
				f3(c.median(func(r *rec) float64 { return r.DeliveredRatio })),
				us(c.median(func(r *rec) float64 { return r.Latency.P50 })),
				us(c.median(func(r *rec) float64 { return r.Latency.P99 })),
				mib(c.median(func(r *rec) float64 { return float64(r.RSS.StartKB) })),
				mib(rss), ratio(rss, base), mib(growth), growthRatio(growth, baseGrowth))
		}
	}
	p("\nRSS growth is RSS max minus RSS start: what the run added, the stalled reader's backlog included (no ratio\n")
	p("where mosquitto grew by less than 1 MiB).\n\n")
	writeStalled(w, m, t)
	writeConflate(w, t)

	p("## Idle connections\n\n")
	p("N connections (MQTT CONNECT, keep-alive 60 s, then one QoS 1 SUBSCRIBE to a topic of their own) opened 64 at a\n")
	p("time; RSS read from `/proc/<pid>/status` before and after (plus a settle time); every connection then answers a\n")
	p("PINGREQ to prove it is served. For keyline, heap (in use after a forced GC), goroutine stacks and goroutines come\n")
	p("from its `/debug/pprof` (`--pprof`), before and after, per connection; mosquitto has no such figures.\n\n")
	p("| case | broker | opened | connects/s | vs mosquitto | RSS before | RSS after | RSS per connection | vs mosquitto | heap per conn | stacks per conn | goroutines per conn | answered PINGREQ |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, cs := range t.cases {
		if caseKind(t, cs) != "connections" {
			continue
		}
		mc := t.get(cs, "mosquitto")
		baseRate := mc.median(func(r *rec) float64 { return r.Connections.ConnectPerS })
		baseRSS := mc.median(func(r *rec) float64 { return r.Connections.RSSPerConnKB })
		for _, b := range t.brokers {
			c := t.get(cs, b)
			rate := c.median(func(r *rec) float64 { return r.Connections.ConnectPerS })
			per := c.median(func(r *rec) float64 { return r.Connections.RSSPerConnKB })
			heap, stack, gor := goCells(c, func(r *rec) *goCost { return r.Connections.Go })
			p("| %s | %s | %s | %s | %s | %s | %s | %.2f KiB | %s | %s | %s | %s | %s |\n", cs, b,
				integer(c.median(func(r *rec) float64 { return float64(r.Connections.Opened) })),
				num(rate), ratio(rate, baseRate),
				mib(c.median(func(r *rec) float64 { return float64(r.Connections.RSSBeforeKB) })),
				mib(c.median(func(r *rec) float64 { return float64(r.Connections.RSSAfterKB) })),
				per, ratio(per, baseRSS), heap, stack, gor,
				integer(c.median(func(r *rec) float64 { return float64(r.Connections.Alive) })))
		}
	}
	p("\n")

	p("## Offline sessions\n\n")
	p("N clients connect with a persistent session (MQTT 3.1.1 clean session 0, or MQTT 5 session expiry 1 h), subscribe\n")
	p("to one topic at QoS 1 and disconnect; RSS is read before and after (plus a settle time); every hundredth session\n")
	p("is then resumed to check the broker kept it (session present).\n\n")
	p("| case | broker | sessions | RSS before | RSS after | RSS per session | vs mosquitto | heap per session | goroutines per session | kept |\n")
	p("|---|---|---|---|---|---|---|---|---|---|\n")
	forKind(t, "sessions", func(r *rec) float64 { return r.Sessions.RSSPerSessionKB }, func(cs, b string, c cell, base float64) {
		per := c.median(func(r *rec) float64 { return r.Sessions.RSSPerSessionKB })
		heap, _, gor := goCells(c, func(r *rec) *goCost { return r.Sessions.Go })
		p("| %s | %s | %s | %s | %s | %.2f KiB | %s | %s | %s | %s of %s |\n", cs, b,
			integer(c.median(func(r *rec) float64 { return float64(r.Sessions.Stored) })),
			mib(c.median(func(r *rec) float64 { return float64(r.Sessions.RSSBeforeKB) })),
			mib(c.median(func(r *rec) float64 { return float64(r.Sessions.RSSAfterKB) })),
			per, ratio(per, base), heap, gor,
			integer(c.median(func(r *rec) float64 { return float64(r.Sessions.Present) })),
			integer(c.median(func(r *rec) float64 { return float64(r.Sessions.Checked) })))
	})
	p("\n")

	if firstCase(t, "wake") != "" {
		p("## Waking up: idle devices that publish once a minute\n\n")
		p("N idle connections (as above) each publish one QoS 1 message per period, their publishes spread evenly over it\n")
		p("(connection i at i/N of the period), and wait for the PUBACK; the broker's CPU is read from `/proc` over the\n")
		p("window. This is the cost of waking an idle connection, reading one packet and answering it, plus whatever the\n")
		p("broker does per second for its idle clients.\n\n")
		p("| case | broker | connections | period | published | acked | broker CPU | broker cores | µs per message | vs mosquitto | PUBACK p50 | PUBACK p99 |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		forKind(t, "wake", func(r *rec) float64 { return r.Wake.BrokerUsPerMsg }, func(cs, b string, c cell, base float64) {
			per := c.median(func(r *rec) float64 { return r.Wake.BrokerUsPerMsg })
			p("| %s | %s | %s | %.0f s | %s | %s | %.2f s | %s | %.0f | %s | %s | %s |\n", cs, b,
				integer(c.median(func(r *rec) float64 { return float64(r.Wake.Opened) })),
				c.median(func(r *rec) float64 { return r.Wake.PeriodS }),
				integer(c.median(func(r *rec) float64 { return float64(r.Wake.Published) })),
				integer(c.median(func(r *rec) float64 { return float64(r.Wake.Acked) })),
				c.median(func(r *rec) float64 { return r.Wake.BrokerCPUS }),
				f3(c.median(func(r *rec) float64 { return r.CPU.Broker })),
				per, ratio(per, base),
				us(c.median(func(r *rec) float64 { return r.Wake.AckLatency.P50 })),
				us(c.median(func(r *rec) float64 { return r.Wake.AckLatency.P99 })))
		})
		p("\n")
	}

	// -------- CPU evidence
	p("## Is the load generator the limit?\n\n")
	p("loadgen measures its own CPU with `getrusage` and the broker's from `/proc/<pid>/stat` over the measured window\n")
	p("(connections: over the connect phase). Cores: 1.00 = one core busy for the whole window; the machine has %s.\n", kv["nproc"])
	p("`µs/msg` is CPU time per delivered message. On loopback the sender's `write()` also runs the receiver's TCP\n")
	p("input path, so each side's CPU includes part of the other's network work.\n\n")
	p("| case | broker | loadgen cores | loadgen share of machine | broker cores | other cores | loadgen µs/msg | broker µs/msg |\n")
	p("|---|---|---|---|---|---|---|---|\n")
	maxShare, maxCase := 0.0, ""
	for _, cs := range t.cases {
		for _, b := range t.brokers {
			c := t.get(cs, b)
			lg := c.median(func(r *rec) float64 { return r.CPU.Loadgen })
			sh := c.median(func(r *rec) float64 { return r.CPU.LoadgenShare })
			if sh > maxShare {
				maxShare, maxCase = sh, cs+" / "+b
			}
			lu, bu := "-", "-"
			if k := caseKind(t, cs); k != "connections" && k != "sessions" {
				lu = f2(c.median(func(r *rec) float64 { return r.CPU.LoadgenUsPerMsg }))
				bu = f2(c.median(func(r *rec) float64 { return r.CPU.BrokerUsPerMsg }))
			}
			p("| %s | %s | %s | %.0f%% | %s | %s | %s | %s |\n", cs, b, f2(lg), sh*100,
				f2(c.median(func(r *rec) float64 { return r.CPU.Broker })),
				f2(c.median(func(r *rec) float64 { return r.CPU.Other })), lu, bu)
		}
	}
	p("\nHighest median loadgen share: %.0f%% of the machine (%s).\n\n", maxShare*100, maxCase)
	writeCPUFindings(w, t)
	writeCalibration(w, t)

	// -------- method and commands
	p("## Method\n\n")
	p("- Each broker listens on a free 127.0.0.1 port and is started fresh for every (case, broker) run and stopped after\n")
	p("  it; each case runs its rounds back to back, the brokers in turn inside a round (%s), so that the runs a\n", strings.Join(m.brokers, ", "))
	p("  ratio compares are minutes apart at most. `loadgen probe` measures the cost of a system call and the latency\n")
	p("  of a 2 KiB write + fdatasync on the brokers' disk at the start, and beside every round of a case with fsync on.\n")
	p("- `integration/loadgen` speaks MQTT with hand-encoded frames: one `bufio.Reader` per connection decoding in place,\n")
	p("  publishers appending frames to one buffer and writing it with one syscall, subscribers batching their acks per read.\n")
	p("  Payloads carry a run id, publisher id, send timestamp (stamped just before the write), per-publisher and per-key\n")
	p("  sequence numbers; loss, reordering, duplicates and latency come from them.\n")
	p("- Rates count the measured window only (after a warm-up); deliveries are counted by receive time, latency and\n")
	p("  delivered/expected by send time; after publishing stops the tool waits (drain) for outstanding deliveries.\n")
	p("- Keyline runs with `--fsync=false` (unless a case says `--fsync=true`) and a fresh data directory; mosquitto with\n")
	p("  persistence off and the configuration under [Commands](#commands) (queues that do not drop what the load can put in\n")
	p("  them); plain mochi is `integration/bench/mochiplain` (mochi with only `auth.AllowHook` and a TCP listener, default\n")
	p("  options).\n\n")

	p("## Reading these numbers\n\n")
	p("- Loopback on one 2-core machine: the load generator and the broker share the cores (and with them whatever else\n")
	p("  runs there); a network between separate machines would move the limits. Compare brokers with each other here,\n")
	p("  not with figures from other hardware.\n")
	p("- Throughput cases hold publishers to `ahead` = 100 messages in front of the slowest subscriber (DESIGN.md's\n")
	p("  yardsticks use the same window), so a broker cannot score by queueing without bound; their latency figures are\n")
	p("  that window's queueing delay. The paced `latency-*` case measures latency.\n")
	p("- `shared-*` cases compare unlike guarantees: Keyline's `$share` groups are Key-Shared (per-key order, at most one\n")
	p("  message per key in flight, appended to the group log before the PUBACK; here with `--fsync=false`), while\n")
	p("  mosquitto and mochi hand each message to some member from memory. The order columns show what that buys.\n")
	p("- mochi drops a message for a client whose outbound queue (8,192 packets by default) is full; such losses appear as\n")
	p("  `gaps` and as delivered/expected below 1.\n")
	p("- Medians of %s rounds damp, but do not remove, the noise of a shared machine; each run's own figures are in the\n", kv["rounds"])
	p("  results file, and the per-round columns show the spread.\n\n")
	p("## Commands\n\n")
	p("Brokers (PORT and HTTPPORT are free loopback ports picked per run):\n\n```\n")
	for _, bc := range m.brokerCmd {
		p("%-10s %s\n", bc[0], bc[1])
	}
	p("```\n\nmosquitto's configuration file (every case):\n\n```\n%s\n```\n\n", strings.ReplaceAll(kv["mosquitto_conf"], ";", "\n"))
	if len(m.caseMosq) > 0 {
		p("mosquitto runs these cases with other settings (replacing those of the same name):\n\n```\n")
		for _, c := range m.cases {
			if f := m.caseMosq[c[0]]; f != "" {
				p("%-18s %s\n", c[0], strings.ReplaceAll(f, ";", " / "))
			}
		}
		p("```\n\n")
	}
	p("Load, per case (every run adds `-addr 127.0.0.1:PORT -broker-pid PID -label BROKER -tag CASE -round N %s`):\n\n```\n", kv["common"])
	for _, c := range m.cases {
		p("%-18s loadgen %s\n", c[0], c[1])
	}
	p("```\n\n")
	if len(m.caseFlags) > 0 {
		p("Keyline runs these cases with extra flags:\n\n```\n")
		for _, c := range m.cases {
			if f := m.caseFlags[c[0]]; f != "" {
				p("%-18s keyline ... %s\n", c[0], f)
			}
		}
		p("```\n\n")
	}
	p("The full argument list of every run is in the `args` field of its line in `%s`.\n", t.resultsRel)

	var failed []string
	for _, r := range recs {
		if !r.OK {
			failed = append(failed, fmt.Sprintf("%s on %s, round %d: %s", r.Tag, r.Label, r.Round, strings.Join(r.Errors, "; ")))
		}
	}
	if len(failed) > 0 || kv["failed_runs"] != "0" && kv["failed_runs"] != "" {
		p("\n## Failed runs\n\n")
		for _, f := range failed {
			p("- %s\n", f)
		}
		p("- failed runs counted by the script: %s\n", kv["failed_runs"])
	}
}

func writeOrderFindings(w *strings.Builder, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	for _, cs := range t.cases {
		if caseKind(t, cs) != "shared" {
			continue
		}
		var parts []string
		for _, b := range t.brokers {
			c := t.get(cs, b).ok()
			if len(c) == 0 {
				continue
			}
			withViol := 0
			for _, r := range c {
				if r.Order != nil && r.Order.OrderViolations > 0 {
					withViol++
				}
			}
			parts = append(parts, fmt.Sprintf("%s showed violations in %d of %d rounds", b, withViol, len(c)))
		}
		p("- `%s`: %s.\n", cs, strings.Join(parts, "; "))
	}
	// What the figures say, from the data: which brokers kept per-key order.
	var kept, broke []string
	for _, b := range t.brokers {
		viol, runs := 0, 0
		for _, cs := range t.cases {
			if caseKind(t, cs) != "shared" {
				continue
			}
			for _, r := range t.get(cs, b).ok() {
				runs++
				if r.Order != nil && (r.Order.OrderViolations > 0 || r.Order.Duplicates > 0 || r.Order.Missing > 0) {
					viol++
				}
			}
		}
		switch {
		case runs == 0:
		case viol == 0:
			kept = append(kept, b)
		default:
			broke = append(broke, b)
		}
	}
	p("\n")
	if len(broke) > 0 {
		p("The checker is proven able to fail: %s broke per-key order (round-robin or random member selection spreads\n", strings.Join(broke, ", "))
		p("every key over all consumers, so a later message of a key is processed before an earlier one). ")
	}
	if len(kept) > 0 {
		p("%s kept every key in order in every shared run, with no duplicates and nothing missing.", strings.Join(kept, ", "))
	}
	p("\n\n")
}

func writeCPUFindings(w *strings.Builder, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	below, total := 0, 0
	maxLG, maxLGCase := 0.0, ""
	var above []string
	for _, cs := range t.cases {
		if k := caseKind(t, cs); k != "throughput" && k != "shared" {
			continue // paced cases (latency, slowsub) and connections set their own pace
		}
		for _, b := range t.brokers {
			c := t.get(cs, b)
			lg := c.median(func(r *rec) float64 { return r.CPU.Loadgen })
			br := c.median(func(r *rec) float64 { return r.CPU.Broker })
			if math.IsNaN(lg) || math.IsNaN(br) {
				continue
			}
			total++
			if lg < br {
				below++
			} else {
				above = append(above, fmt.Sprintf("%s on %s (%.2f vs %.2f cores)", cs, b, lg, br))
			}
			if lg > maxLG {
				maxLG, maxLGCase = lg, cs+" on "+b
			}
		}
	}
	p("In %d of %d flood cases (medians; the paced cases set their own rate) the load generator used less CPU than\n", below, total)
	p("the broker it drove.\n")
	if len(above) > 0 {
		p("Not in: %s. There the two needed\n", strings.Join(above, ", "))
		p("about equal CPU per message (each delivery arriving alone costs the reader a syscall, as the broker's write\n")
		p("costs the broker), so on two shared cores that broker's figure is a lower bound of what it does with a core\n")
		p("to itself.\n")
	}
	p("The load generator's largest median in them was %.2f cores (%s),\n", maxLG, maxLGCase)
	if maxLG < 1 {
		p("below one core. Its cost per message (`loadgen µs/msg`) stays near constant or falls as rates rise (it\n")
		p("batches per read and per write), so at L cores it could have carried about 1/L times the measured rate: where\n")
		p("L is small the broker, not the load generator, set the rate. Where `other cores` is high, other work on this\n")
		p("shared machine took CPU from both.\n")
	} else {
		p("so in that case it may have competed with the broker for the two cores.\n")
	}
	p("QoS 1 cases cost the load generator about as many syscalls per message as the broker (a read and an ack write on\n")
	p("each side), which shows in `µs/msg`.\n\n")
}

func writeCalibration(w *strings.Builder, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var rows []string
	for _, cs := range t.cases {
		c := t.get(cs, "nullbroker")
		if len(c.ok()) == 0 {
			continue
		}
		d := c.median(func(r *rec) float64 { return r.DeliveredPerS })
		best, bestB := 0.0, ""
		for _, b := range t.brokers {
			if v := t.get(cs, b).median(func(r *rec) float64 { return r.DeliveredPerS }); !math.IsNaN(v) && v > best {
				best, bestB = v, b
			}
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s (%s) | %s |", cs, num(d),
			f2(c.median(func(r *rec) float64 { return r.CPU.Loadgen })),
			f2(c.median(func(r *rec) float64 { return r.CPU.LoadgenUsPerMsg })),
			f2(c.median(func(r *rec) float64 { return r.CPU.Other })),
			num(best), bestB, ratio(d, best)))
	}
	if len(rows) == 0 {
		return
	}
	p("### The load generator's ceiling\n\n")
	p("The QoS 0 fan-out cases also ran against `loadgen nullbroker`, a calibration target inside the load generator:\n")
	p("it accepts CONNECT/SUBSCRIBE and forwards each publisher's read batch to every subscriber of the exact topic by\n")
	p("reference with one writev per wakeup, and does nothing else an MQTT broker must do. What the load generator\n")
	p("reaches against it is a lower bound on its own capacity here, to set beside the brokers' figures.\n\n")
	p("| case | delivered msg/s (nullbroker) | loadgen cores | loadgen µs/msg | other cores | best broker | headroom |\n")
	p("|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		p("%s\n", r)
	}
	p("\n")
}

// ---------------------------------------------------------------- charts

var brokerColor = map[string]color.Color{
	"mosquitto": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"mochi":     color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"keyline":   color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// goCells formats the median Go costs of a cell ("-" where there are none).
func goCells(c cell, get func(*rec) *goCost) (heap, stack, goroutines string) {
	has := false
	for _, r := range c {
		if r.OK && get(r) != nil {
			has = true
		}
	}
	if !has {
		return "-", "-", "-"
	}
	val := func(f func(*goCost) float64) float64 {
		return c.median(func(r *rec) float64 {
			if g := get(r); g != nil {
				return f(g)
			}
			return math.NaN()
		})
	}
	return fmt.Sprintf("%.2f KiB", val(func(g *goCost) float64 { return g.HeapKB })),
		fmt.Sprintf("%.2f KiB", val(func(g *goCost) float64 { return g.StackKB })),
		fmt.Sprintf("%.2f", val(func(g *goCost) float64 { return g.Goroutines }))
}

func drawCharts(t *table, dir, rel string) ([]string, error) {
	var md []string
	if ok, err := chartConnRSS(t, filepath.Join(dir, "connections-rss.png")); err != nil {
		return nil, err
	} else if ok {
		md = append(md, fmt.Sprintf("![Broker RSS against idle connections](%s/connections-rss.png)", rel))
	}
	if ok, err := chartFanout(t, filepath.Join(dir, "fanout-throughput.png")); err != nil {
		return nil, err
	} else if ok {
		md = append(md, fmt.Sprintf("![Delivered msg/s by subscriber count](%s/fanout-throughput.png)", rel))
	}
	if ok, err := chartLatency(t, filepath.Join(dir, "latency.png")); err != nil {
		return nil, err
	} else if ok {
		md = append(md, fmt.Sprintf("![Latency percentiles at a fixed rate](%s/latency.png)", rel))
	}
	if ok, err := chartRSS(t, filepath.Join(dir, "slowsub-rss.png")); err != nil {
		return nil, err
	} else if ok {
		md = append(md, fmt.Sprintf("![Broker RSS with one stalled subscriber](%s/slowsub-rss.png)", rel))
	}
	if ok, err := chartOrder(t, filepath.Join(dir, "shared-order.png")); err != nil {
		return nil, err
	} else if ok {
		md = append(md, fmt.Sprintf("![Per-key order violations in $share groups](%s/shared-order.png)", rel))
	}
	return md, nil
}

func chartFanout(t *table, path string) (bool, error) {
	p := plot.New()
	p.Title.Text = "Fan-out: delivered msg/s by subscriber count (QoS 0, 64 B payload, median)"
	p.X.Label.Text = "subscribers"
	p.Y.Label.Text = "delivered msg/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	any := false
	minY := math.Inf(1)
	for _, b := range t.brokers {
		var xys plotter.XYs
		for _, cs := range t.cases {
			c := t.get(cs, b).ok()
			if len(c) == 0 || kind(c) != "throughput" || c[0].Scenario != "fanout" || c[0].QoS != 0 || c[0].Pubs != 1 {
				continue
			}
			xys = append(xys, plotter.XY{X: float64(c[0].Subs), Y: c.median(func(r *rec) float64 { return r.DeliveredPerS })})
		}
		if len(xys) < 2 {
			continue
		}
		sort.Slice(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
		for _, xy := range xys {
			minY = math.Min(minY, xy.Y)
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return false, err
		}
		l.Color, pts.Color = brokerColor[b], brokerColor[b]
		l.Width = vg.Points(2)
		p.Add(l, pts)
		p.Legend.Add(b, l, pts)
		any = true
	}
	if !any {
		return false, nil
	}
	var ceil plotter.XYs
	for _, cs := range t.cases {
		c := t.get(cs, "nullbroker").ok()
		if len(c) == 0 || c[0].Scenario != "fanout" || c[0].QoS != 0 {
			continue
		}
		ceil = append(ceil, plotter.XY{X: float64(c[0].Subs), Y: c.median(func(r *rec) float64 { return r.DeliveredPerS })})
	}
	if len(ceil) >= 2 {
		sort.Slice(ceil, func(i, j int) bool { return ceil[i].X < ceil[j].X })
		p.Title.Text += "\n(dashed: the load generator against its null broker, for scale)"
		l, pts, err := plotter.NewLinePoints(ceil)
		if err != nil {
			return false, err
		}
		l.Color, pts.Color = color.Gray{Y: 0x80}, color.Gray{Y: 0x80}
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(l, pts)
		p.Legend.Add("loadgen ceiling (nullbroker)", l, pts)
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = minY / 2
		p.Y.Label.Text = "delivered msg/s (log scale)"
	}
	p.Y.Max *= 1.25 // room for the legend
	if _, ok := p.Y.Scale.(plot.LogScale); ok {
		p.Y.Max *= 3
	}
	p.Add(plotter.NewGrid())
	return true, p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// firstCase returns the first case of the given kind, "" if there is none.
func firstCase(t *table, kind string) string {
	for _, c := range t.cases {
		if caseKind(t, c) == kind {
			return c
		}
	}
	return ""
}

func chartLatency(t *table, path string) (bool, error) {
	cs := firstCase(t, "latency")
	if cs == "" {
		return false, nil
	}
	p := plot.New()
	var rate float64
	var subs int
	for _, b := range t.brokers {
		if c := t.get(cs, b).ok(); len(c) > 0 {
			rate, subs = c[0].Rate, c[0].Subs
		}
	}
	p.Title.Text = fmt.Sprintf("Latency at %s msg/s to %d subscribers (%s, median of rounds)", num(rate), subs, cs)
	p.Y.Label.Text = "latency (µs, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	names := []string{"p50", "p90", "p99", "p99.9", "max"}
	fs := []func(*rec) float64{
		func(r *rec) float64 { return r.Latency.P50 }, func(r *rec) float64 { return r.Latency.P90 },
		func(r *rec) float64 { return r.Latency.P99 }, func(r *rec) float64 { return r.Latency.P999 },
		func(r *rec) float64 { return r.Latency.Max },
	}
	any := false
	for _, b := range t.brokers {
		c := t.get(cs, b)
		var xys plotter.XYs
		for j, f := range fs {
			if v := c.median(f); !math.IsNaN(v) {
				xys = append(xys, plotter.XY{X: float64(j), Y: math.Max(v, 1)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return false, err
		}
		l.Color, pts.Color = brokerColor[b], brokerColor[b]
		l.Width = vg.Points(2)
		p.Add(l, pts)
		p.Legend.Add(b, l, pts)
		any = true
	}
	if !any {
		return false, nil
	}
	p.Y.Max *= 3 // room for the legend (log scale)
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return true, p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

func chartRSS(t *table, path string) (bool, error) {
	cs := firstCase(t, "slowsub")
	if cs == "" {
		return false, nil
	}
	p := plot.New()
	p.Title.Text = "Broker RSS while one subscriber stops reading (run with the median peak)"
	p.X.Label.Text = "seconds since publishing started"
	p.Y.Label.Text = "RSS (MiB)"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	any := false
	for _, b := range t.brokers {
		r := t.get(cs, b).medianRec(func(r *rec) float64 { return float64(r.RSS.MaxKB) })
		if r == nil || r.RSS == nil || len(r.RSS.Series) < 2 {
			continue
		}
		xys := make(plotter.XYs, len(r.RSS.Series))
		for i, s := range r.RSS.Series {
			xys[i] = plotter.XY{X: float64(s[0]) / 1000, Y: float64(s[1]) / 1024}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return false, err
		}
		l.Color = brokerColor[b]
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (published %s/s)", b, num(r.PublishedPerS)), l)
		any = true
	}
	if !any {
		return false, nil
	}
	p.Y.Max *= 1.3 // room for the legend
	p.Add(plotter.NewGrid())
	return true, p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// chartConnRSS draws the broker's RSS (after, median) against the number of
// idle connections, one line per broker, from every connections case.
func chartConnRSS(t *table, path string) (bool, error) {
	p := plot.New()
	p.Title.Text = "Broker RSS with N idle connections (CONNECT + one SUBSCRIBE each)"
	p.X.Label.Text = "idle connections"
	p.Y.Label.Text = "RSS (MiB)"
	p.X.Min, p.Y.Min = 0, 0
	p.Legend.Top = true
	p.Legend.Left = true
	lines := 0
	for _, b := range t.brokers {
		var xys plotter.XYs
		for _, cs := range t.cases {
			if caseKind(t, cs) != "connections" {
				continue
			}
			c := t.get(cs, b)
			n := c.median(func(r *rec) float64 { return float64(r.Connections.Opened) })
			rss := c.median(func(r *rec) float64 { return float64(r.Connections.RSSAfterKB) })
			if n > 0 && rss > 0 && !math.IsNaN(n) && !math.IsNaN(rss) {
				xys = append(xys, plotter.XY{X: n, Y: rss / 1024})
			}
		}
		if len(xys) < 2 {
			continue
		}
		sort.Slice(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return false, err
		}
		l.Color, pts.Color = brokerColor[b], brokerColor[b]
		l.Width = vg.Points(2)
		p.Add(l, pts)
		p.Legend.Add(b, l, pts)
		lines++
	}
	if lines == 0 {
		return false, nil
	}
	p.Y.Max *= 1.15
	p.Add(plotter.NewGrid())
	return true, p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

func chartOrder(t *table, path string) (bool, error) {
	var cases []string
	for _, c := range t.cases {
		if caseKind(t, c) == "shared" {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		return false, nil
	}
	p := plot.New()
	p.Title.Text = "$share groups: per-key order violations (median of rounds; 0 means in order)"
	p.Title.Padding = vg.Points(8)
	p.Y.Label.Text = "order violations"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	w := vg.Points(22)
	n := len(t.brokers)
	for i, b := range t.brokers {
		vals := make(plotter.Values, len(cases))
		for j, cs := range cases {
			v := t.get(cs, b).median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })
			if math.IsNaN(v) {
				v = 0
			}
			vals[j] = v
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return false, err
		}
		bars.Color = brokerColor[b]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(bars)
		var vs []string
		for _, v := range vals {
			vs = append(vs, integer(v))
		}
		p.Legend.Add(fmt.Sprintf("%s (%s)", b, strings.Join(vs, " / ")), bars)
	}
	p.NominalX(cases...)
	p.X.Min, p.X.Max = -0.7, float64(len(cases))-0.3
	p.Y.Max = math.Max(p.Y.Max*1.35, 10)
	p.Add(plotter.NewGrid())
	return true, p.Save(8*vg.Inch, 4*vg.Inch, path)
}

// forKind calls f for every broker's cell of every case of kind k, with the
// median of value over mosquitto's runs of that case (the ratios' base).
func forKind(t *table, k string, value func(*rec) float64, f func(cs, b string, c cell, base float64)) {
	for _, cs := range t.cases {
		if caseKind(t, cs) != k {
			continue
		}
		base := t.get(cs, "mosquitto").median(value)
		for _, b := range t.brokers {
			f(cs, b, t.get(cs, b), base)
		}
	}
}
