package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// line fakes one loadgen JSON line.
func line(tag, label string, round int, scenario string, extra string, delivered float64, ok bool) string {
	return fmt.Sprintf(`{"scenario":%q,"label":%q,"tag":%q,"round":%d,"ok":%v,"errors":%s,"proto":5,"qos":0,"publishers":1,"subscribers":10,`+
		`"published_per_s":%g,"delivered_per_s":%g,"delivered_ratio":1,"latency_us":{"p50":100,"p90":200,"p99":%g,"p999":900,"max":1000},`+
		`"cpu":{"loadgen_cores":0.2,"broker_cores":0.8,"other_cores":0.1,"loadgen_share":0.1,"loadgen_us_per_msg":1,"broker_us_per_msg":4}%s}`,
		scenario, label, tag, round, ok, map[bool]string{true: "null", false: `["boom"]`}[ok], delivered/10, delivered, 500+delivered/1000, extra)
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	for round := 1; round <= 3; round++ {
		for i, b := range []string{"keyline", "mosquitto", "mochi", "nullbroker"} {
			d := float64(100000 * (i + 1) * round)
			for _, subs := range []int{1, 10} {
				l := line(fmt.Sprintf("fanout-s%d", subs), b, round, "fanout", "", d, true)
				lines = append(lines, strings.Replace(l, `"subscribers":10`, fmt.Sprintf(`"subscribers":%d`, subs), 1))
			}
			if b == "nullbroker" {
				continue
			}
			lines = append(lines, strings.Replace(line("latency-s10", b, round, "fanout", "", d, true), `"publishers":1`, `"publishers":1,"rate":5000`, 1))
			viol := 0
			if b != "keyline" {
				viol = 10 * round
			}
			lines = append(lines, line("shared-prop", b, round, "shared",
				fmt.Sprintf(`,"order":{"keys":64,"unique":1000,"order_violations":%d,"keys_with_violations":3,"keys_on_several_consumers":%d}`, viol, viol), d, b != "mochi" || round != 2))
			lines = append(lines, line("slowsub", b, round, "slowsub",
				`,"stalled":1,"rate":20000,"broker_rss":{"start_kb":1000,"max_kb":5000,"end_kb":4000,"series":[[0,1000],[200,5000],[400,4000]]}`, d, true))
			// A slowsub run without RSS (no broker pid) must not break the report.
			if round == 3 && b == "mochi" {
				lines = append(lines, line("slowsub", b, 4, "slowsub", `,"stalled":1`, d, true))
			}
			lines = append(lines, line("connections", b, round, "connections",
				`,"connections":{"requested":100,"opened":100,"connect_per_s":5000,"alive":100,"rss_before_kb":1000,"rss_after_kb":2000,"rss_per_conn_kb":10}`, 0, true))
		}
	}
	results := filepath.Join(dir, "results.jsonl")
	if err := os.WriteFile(results, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := "date\ttoday\nnproc\t2\nrounds\t3\nquick\t0\nbrokers\tkeyline mosquitto mochi\nfailed_runs\t1\n" +
		"broker_cmd\tkeyline\tkeyline --tcp 127.0.0.1:PORT\n" +
		"case\tfanout-s1\t-scenario fanout -subs 1\ncase\tfanout-s10\t-scenario fanout -subs 10\n" +
		"case\tlatency-s10\t-scenario fanout -subs 10 -rate 5000\ncase\tshared-prop\t-scenario shared\n" +
		"case\tslowsub\t-scenario slowsub\ncase\tconnections\t-scenario connections\n"
	metaPath := filepath.Join(dir, "meta.tsv")
	if err := os.WriteFile(metaPath, []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(dir, "BENCHMARKS.md")
	charts := filepath.Join(dir, "charts")
	if err := run(results, metaPath, md, charts); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		"| fanout-s10 | delivered msg/s | 400k | 600k (1.50x) | 200k (0.50x) |", // medians of rounds 1..3, ratio to mosquitto
		"| shared-prop | per-key order violations | 20 | 20 | 0 |",              // counts carry no ratio
		"keyline showed violations in 0 of 3 rounds",
		"mochi showed violations in 2 of 2 rounds",
		"The load generator's ceiling",
		"shared-prop on mochi, round 2: boom",
		"![Delivered msg/s by subscriber count](charts/fanout-throughput.png)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, f := range []string{"fanout-throughput.png", "latency.png", "slowsub-rss.png", "shared-order.png"} {
		if st, err := os.Stat(filepath.Join(charts, f)); err != nil || st.Size() == 0 {
			t.Errorf("chart %s: %v", f, err)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestManualSectionsAreKept: what follows the marker in an existing report
// survives a new one; a report without the marker keeps nothing of it.
func TestManualSectionsAreKept(t *testing.T) {
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	if got := manualSections(md); got != "" {
		t.Fatalf("no file: %q", got)
	}
	tail := manualMarker + "\n\n## By hand\n\nfigures\n"
	if err := os.WriteFile(md, []byte("# old generated part\n\n"+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := manualSections(md); got != "\n"+tail {
		t.Fatalf("kept %q", got)
	}
	if err := os.WriteFile(md, []byte("# generated only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := manualSections(md); got != "" {
		t.Fatalf("kept %q from a report without the marker", got)
	}
}
