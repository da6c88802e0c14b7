package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// probeCell returns the probes measured for tag (the machine probe at the
// start of the run is "probe"; the ones beside a durable case's rounds are
// "probe:<case>").
func probeCell(t *table, tag string) cell { return t.get(tag, "machine") }

// writeProbe adds the machine probe's figures to the machine table.
func writeProbe(w *strings.Builder, t *table) {
	c := probeCell(t, "probe")
	if len(c.ok()) == 0 {
		return
	}
	fmt.Fprintf(w, "| system call (getppid), median | %.0f ns |\n", c.median(func(r *rec) float64 { return r.SyscallNS }))
	fmt.Fprintf(w, "| write of %d B + fdatasync on the brokers' disk, p50 / p99 | %s / %s |\n", c.ok()[0].WriteBytes,
		us(c.median(func(r *rec) float64 { return r.Fdatasync.P50 })), us(c.median(func(r *rec) float64 { return r.Fdatasync.P99 })))
}

// argValue returns the value of flag name (e.g. "-inflight") in a run's
// arguments, "" if absent.
func argValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// load describes what a shared case's publishers did.
func load(c cell) string {
	ok := c.ok()
	if len(ok) == 0 {
		return "n/a"
	}
	r := ok[0]
	inflight := argValue(r.Args, "-inflight")
	if inflight == "" {
		inflight = "1000"
	}
	keys := 0
	if r.Order != nil {
		keys = r.Order.Keys
	}
	s := fmt.Sprintf("%d publisher(s) × %s in flight, %d consumers, %d keys, QoS %d, %d B", r.Pubs, inflight, r.Consumers, keys, r.QoS, r.Payload)
	if r.Rate > 0 {
		s += fmt.Sprintf(", paced at %s msg/s", num(r.Rate))
	}
	return s
}

// writeDurable writes the durable Key-Shared cases (ks-*) as the issue that
// set their targets lays them out: same-run ratios to mosquitto, each case's
// load, what each broker lost, and the fsync bound beside the fsync cases.
func writeDurable(w *strings.Builder, m *meta, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var flood, paced []string
	for _, cs := range t.cases {
		if !strings.HasPrefix(cs, "ks-") || caseKind(t, cs) != "shared" {
			continue
		}
		if c := t.get(cs, "keyline").ok(); len(c) > 0 && c[0].Rate > 0 {
			paced = append(paced, cs)
		} else {
			flood = append(flood, cs)
		}
	}
	if len(flood)+len(paced) == 0 {
		return
	}
	p("### Durable Key-Shared beside mosquitto's `$share`\n\n")
	p("Keyline's group is Key-Shared and durable: every message is appended to the group's segment log before its\n")
	p("PUBACK (with `--fsync=true`, made durable with fdatasync first), each key stays on one consumer in order, and\n")
	p("nothing is lost. mosquitto hands each message to the next consumer from memory (round robin) and persists\n")
	p("nothing; it is configured not to drop what the load can queue (see [Commands](#commands)). The rounds of a\n")
	p("case alternate the brokers (keyline, mosquitto, keyline, ...); ratios are of the medians.\n\n")
	if len(flood) > 0 {
		p("| case | load | messages published (keyline / mosquitto) | mosquitto msg/s | keyline msg/s | keyline / mosquitto | fsync bound: in flight / fdatasync p50 | keyline / bound | mosquitto missing, order violations | keyline missing, order violations, duplicates | rounds, keyline; mosquitto |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, cs := range flood {
			k, mq := t.get(cs, "keyline"), t.get(cs, "mosquitto")
			rate := func(r *rec) float64 { return r.DeliveredPerS }
			kv, mv := k.median(rate), mq.median(rate)
			bound, share := "-", "-"
			if pc := probeCell(t, "probe:"+cs); len(pc.ok()) > 0 {
				b := pc.median(func(r *rec) float64 { return r.FsyncBound })
				bound = fmt.Sprintf("%s msg/s (%s)", num(b), us(pc.median(func(r *rec) float64 { return r.Fdatasync.P50 })))
				share = fmt.Sprintf("%.0f%%", 100*boundShare(k, pc))
			}
			p("| %s | %s | %s / %s | %s | %s | %s | %s | %s | %s, %s | %s, %s, %s | %s; %s |\n", cs, load(k),
				integer(k.median(func(r *rec) float64 { return float64(r.PublishedAll) })),
				integer(mq.median(func(r *rec) float64 { return float64(r.PublishedAll) })),
				num(mv), num(kv), ratio(kv, mv), bound, share,
				integer(mq.median(func(r *rec) float64 { return float64(r.Order.Missing) })),
				integer(mq.median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })),
				integer(k.median(func(r *rec) float64 { return float64(r.Order.Missing) })),
				integer(k.median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })),
				integer(k.median(func(r *rec) float64 { return float64(r.Order.Duplicates) })),
				k.all(rate, num), mq.all(rate, num))
		}
		p("\nThe fsync bound is what one publisher with that many messages in flight gets if each message waits for one\n")
		p("commit and every commit carries the whole window: in flight / (write + fdatasync latency), measured with\n")
		p("`loadgen probe` on the same disk just before each round (its median over the rounds is shown); keyline / bound\n")
		p("is the median over the rounds of each round's rate over that round's bound.\n\n")
		writeInRunCommits(w, m, flood)
	}
	if len(paced) > 0 {
		p("| case | load | broker CPU, %% of a core: mosquitto | keyline | ratio | broker µs/msg: mosquitto | keyline | p50: mosquitto | keyline | p99: mosquitto | keyline | p99 ratio | missing: mosquitto; keyline | order violations: mosquitto; keyline |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, cs := range paced {
			k, mq := t.get(cs, "keyline"), t.get(cs, "mosquitto")
			cpu := func(r *rec) float64 { return 100 * r.CPU.Broker }
			per := func(r *rec) float64 { return r.CPU.BrokerUsPerMsg }
			p50 := func(r *rec) float64 { return r.Latency.P50 }
			p99 := func(r *rec) float64 { return r.Latency.P99 }
			kc, mc, kp, mp := k.median(cpu), mq.median(cpu), k.median(p99), mq.median(p99)
			p("| %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s; %s | %s; %s |\n", cs, load(k), mc, kc, ratio(kc, mc),
				f2(mq.median(per)), f2(k.median(per)), us(mq.median(p50)), us(k.median(p50)), us(mp), us(kp), ratio(kp, mp),
				integer(mq.median(func(r *rec) float64 { return float64(r.Order.Missing) })),
				integer(k.median(func(r *rec) float64 { return float64(r.Order.Missing) })),
				integer(mq.median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })),
				integer(k.median(func(r *rec) float64 { return float64(r.Order.OrderViolations) })))
		}
		p("\nAt a fixed rate the latency keyline adds over mosquitto is its durability: the commit (a write and, with\n")
		p("`--fsync=true`, an fdatasync, coalesced with other appends over at most the commit interval) before the\n")
		p("consumer's delivery.\n\n")
		writeInRunCommits(w, m, paced)
	}
}

// writeInRunCommits lists what keyline's segment log reported after each
// durable run (integration/bench/run reads its /metrics): the disk idle
// (the probe) and the disk under the run's load can differ several times.
func writeInRunCommits(w *strings.Builder, m *meta, cases []string) {
	var lines []string
	for _, cs := range cases {
		for k, v := range m.kv {
			if rest, ok := strings.CutPrefix(k, "in_run_commits:"+cs+":"); ok {
				lines = append(lines, fmt.Sprintf("- %s, round %s: %s\n", cs, rest, v))
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	sort.Strings(lines)
	fmt.Fprintf(w, "What keyline's segment log reported after each of these runs (`keyline_group_log_*` on /metrics): the\n")
	fmt.Fprintf(w, "fdatasync latency under the run's load, and the fsync bound it gives, beside the idle probe's above.\n\n")
	for _, l := range lines {
		w.WriteString(l)
	}
	w.WriteString("\n")
}

// boundShare is the median over rounds of keyline's rate in a round over the
// fsync bound measured beside that round.
func boundShare(k, probes cell) float64 {
	bounds := map[int]float64{}
	for _, r := range probes.ok() {
		bounds[r.Round] = r.FsyncBound
	}
	var v cell
	for _, r := range k.ok() {
		if b := bounds[r.Round]; b > 0 {
			x := *r
			x.DeliveredPerS = r.DeliveredPerS / b
			v = append(v, &x)
		}
	}
	return v.median(func(r *rec) float64 { return r.DeliveredPerS })
}

// writeStalled shows, for the stalled-reader cases, the backlog each broker
// kept for the reader that stopped reading: it is read once publishing
// stopped and the RSS was taken.
func writeStalled(w *strings.Builder, m *meta, t *table) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var rows []string
	for _, cs := range t.cases {
		if caseKind(t, cs) != "slowsub" {
			continue
		}
		for _, b := range t.brokers {
			c := t.get(cs, b)
			if len(c.ok()) == 0 || c.ok()[0].Stall == nil || c.ok()[0].QoS == 0 {
				continue
			}
			held := c.median(func(r *rec) float64 { return float64(r.Stall.Received) })
			growth := c.median(rssGrowth)
			per := "n/a"
			if held > 0 && !math.IsNaN(growth) {
				per = fmt.Sprintf("%.2f KiB", growth/held)
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", cs, b, sessionBound(m, cs, b),
				integer(c.median(func(r *rec) float64 { return float64(r.Stall.Published) })), integer(held),
				integer(c.median(func(r *rec) float64 { return float64(r.Stall.Missing) })),
				integer(c.median(func(r *rec) float64 { return float64(r.Stall.FirstLossAfter) })),
				mib(growth), per))
		}
	}
	if len(rows) == 0 {
		return
	}
	p("What each broker kept for the stalled reader, read once publishing had stopped and the RSS was taken (`held`);\n")
	p("`first loss after` is how many it got in order before the first message missing. Both brokers hold the same\n")
	p("bound per session, so neither should lose one before it.\n\n")
	p("| case | broker | bound per session | published | held | dropped | first loss after | RSS growth | growth per held message |\n")
	p("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		p("%s\n", r)
	}
	p("\n")
}

// sessionBound names the QoS 1/2 messages a broker holds for one session in case cs.
func sessionBound(m *meta, cs, b string) string {
	switch b {
	case "keyline":
		f := strings.Fields(m.caseFlags[cs])
		for i, x := range f {
			if x == "--max-inflight" && i+1 < len(f) {
				return "--max-inflight " + f[i+1]
			}
		}
		return "--max-inflight 8192 (default)"
	case "mosquitto":
		set := map[string]string{}
		for _, l := range strings.Split(m.kv["mosquitto_conf"]+";"+m.caseMosq[cs], ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
				set[k] = v
			}
		}
		inf, _ := strconv.Atoi(set["max_inflight_messages"])
		q, _ := strconv.Atoi(set["max_queued_messages"])
		return fmt.Sprintf("%d in flight + %d queued", inf, q)
	}
	return "n/a"
}
