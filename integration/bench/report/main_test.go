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

// TestDurableAndStalledTables: the ks-* cases get the same-run table with
// their load and the fsync bound of the probes beside their rounds; the
// stalled-reader cases show what each broker held; the machine probe and the
// mosquitto configuration are printed.
func TestDurableAndStalledTables(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	lines = append(lines, `{"scenario":"probe","label":"machine","tag":"probe","ok":true,"syscall_ns":1100,"fdatasync_us":{"p50":250,"p90":300,"p99":900},"write_bytes":2048,"inflight":20,"fsync_bound_per_s":80000}`)
	for round := 1; round <= 3; round++ {
		lines = append(lines, fmt.Sprintf(`{"scenario":"probe","label":"machine","tag":"probe:ks-p1-fsync","round":%d,"ok":true,"syscall_ns":1100,"fdatasync_us":{"p50":%d,"p90":300,"p99":900},"write_bytes":2048,"inflight":20,"fsync_bound_per_s":%d}`,
			round, 200+50*round, 20_000_000/(200+50*round)))
		for i, b := range []string{"keyline", "mosquitto"} {
			d := float64(40000 + 10000*i + 1000*round)
			l := line("ks-p1-fsync", b, round, "shared", fmt.Sprintf(`,"consumers":4,"payload":64,"published_all":%d,"args":["-inflight","20"],"order":{"keys":1000,"unique":1000,"missing":%d,"order_violations":%d}`,
				int(d)*4, i*7, i*30), d, true)
			lines = append(lines, l)
			l = line("ks-steady2000-fsync", b, round, "shared", `,"rate":2000,"consumers":4,"order":{"keys":1000}`, 2000, true)
			lines = append(lines, strings.Replace(l, `"broker_cores":0.8`, fmt.Sprintf(`"broker_cores":%v`, 0.05+0.05*float64(1-i)), 1))
			lines = append(lines, line("slowsub-q1", b, round, "slowsub",
				fmt.Sprintf(`,"qos":1,"stalled":1,"rate":2000,"broker_rss":{"start_kb":1000,"max_kb":%d,"end_kb":4000},"stalled_readers":{"readers":1,"published":30000,"received":8192,"missing":21808,"first_loss_after":8192}`, 11000+10000*(1-i)), 2000, true))
		}
	}
	results := filepath.Join(dir, "results.jsonl")
	if err := os.WriteFile(results, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := "date\ttoday\nnproc\t2\nrounds\t3\nquick\t0\nbrokers\tkeyline mosquitto\nfailed_runs\t0\n" +
		"mosquitto_conf\tlistener PORT 127.0.0.1;max_inflight_messages 1000;max_queued_messages 100000\n" +
		"case\tslowsub-q1\t-scenario slowsub\ncase_mosquitto\tslowsub-q1\tmax_inflight_messages 20;max_queued_messages 8172\n" +
		"case\tks-p1-fsync\t-scenario shared -pubs 1 -inflight 20\ncase_flags\tks-p1-fsync\t--fsync=true\n" +
		"case\tks-steady2000-fsync\t-scenario shared -rate 2000\n"
	metaPath := filepath.Join(dir, "meta.tsv")
	if err := os.WriteFile(metaPath, []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := run(results, metaPath, md, filepath.Join(dir, "charts")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		"| system call (getppid), median | 1100 ns |",
		// keyline 42k (median), mosquitto 52k; bounds 80k, 66.7k, 57.1k: per-round shares 51%, 63%, 75%
		"| ks-p1-fsync | 1 publisher(s) × 20 in flight, 4 consumers, 1000 keys, QoS 0, 64 B | 168000 / 208000 | 52k | 42k | 0.81x | 67k msg/s (300 µs) | 63% | 7, 30 | 0, 0, 0 | 41k, 42k, 43k; 51k, 52k, 53k |",
		"| ks-steady2000-fsync | 1 publisher(s) × 1000 in flight, 4 consumers, 1000 keys, QoS 0, 0 B, paced at 2.0k msg/s | 5.0 | 10.0 | 2.00x |",
		"| slowsub-q1 | mosquitto | 20 in flight + 8172 queued | 30000 | 8192 | 21808 | 8192 | 9.8 MiB | 1.22 KiB |",
		"| slowsub-q1 | keyline | --max-inflight 8192 (default) | 30000 | 8192 | 21808 | 8192 | 19.5 MiB | 2.44 KiB |",
		"max_queued_messages 100000\n",
		"slowsub-q1         max_inflight_messages 20 / max_queued_messages 8172",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
