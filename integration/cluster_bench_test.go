package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// BenchmarkClusterFanoutBeforeAfter measures QoS 1 fan-out to 30
// subscribers (MQTT 3.1.1) spread over three cluster nodes, four publishers
// on the first, for two keyline binaries in one run: an older build
// (KEYLINE_BEFORE) and this tree's, alternating round by round, each round
// on a fresh 3-server NATS cluster, and reports the ratio of their medians
// (after/before). The nodes are real processes; the NATS servers and the
// clients run in the test.
//
//	git worktree add --detach /tmp/before c8dc5e6 && (cd /tmp/before && go build -o /tmp/keyline-before .)
//	KEYLINE_BEFORE=/tmp/keyline-before KEYLINE_BENCH_ROUNDS=3 [KEYLINE_BENCH_PROFILE=/tmp/prof] \
//	  go test -run '^$' -bench ClusterFanoutBeforeAfter -benchtime 1x ./integration/
func BenchmarkClusterFanoutBeforeAfter(b *testing.B) {
	before := os.Getenv("KEYLINE_BEFORE")
	if before == "" {
		b.Skip("KEYLINE_BEFORE names the keyline binary to compare this tree's with")
	}
	rounds := 3
	if v := os.Getenv("KEYLINE_BENCH_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil || rounds < 1 || rounds > 20 {
			b.Fatalf("KEYLINE_BENCH_ROUNDS=%q: want 1 to 20", v)
		}
	}
	// KEYLINE_BENCH_PROFILE names a directory for a CPU profile of the
	// publishers' node per run (8 s from its start).
	profiles := os.Getenv("KEYLINE_BENCH_PROFILE")
	const subs, msgs = 30, 3000
	sides := []struct{ name, bin string }{{"before", before}, {"after", keylineBin}}
	rates := make([][]float64, len(sides))
	for r := range rounds {
		for i, side := range sides {
			b.Run(fmt.Sprintf("round%d/%s", r+1, side.name), func(b *testing.B) {
				nc := natstest.Start(b, 3)
				var addrs, https []string
				for j, u := range nc.URLs() {
					args := []string{"--nats", u, "--node-id", fmt.Sprintf("bench-%d", j), "--nats-replicas", "3"}
					if profiles != "" {
						args = append(args, "--config", pprofConfig(b))
					}
					// One after the other: nodes started together did not
					// come up before issue 22 (c8dc5e6 is such a build).
					p := launchBinary(b, side.bin, 0, b.TempDir(), args...)
					p.waitStarted(b, startTimeout)
					addrs, https = append(addrs, p.addrs["tcp"]), append(https, p.addrs["http"])
				}
				var profiled chan error
				if profiles != "" { // the publishers' node, through most of the run
					profiled = make(chan error, 1)
					go func() {
						profiled <- fetchProfile(https[0], filepath.Join(profiles, fmt.Sprintf("%s-round%d.pprof", side.name, r+1)))
					}()
				}
				run := mqtttest.MeasureFanout(b, mqtttest.FanoutTarget{Subs: addrs, Pub: addrs[0]}, subs, msgs, 1)
				if profiled != nil {
					if err := <-profiled; err != nil {
						b.Fatal(err)
					}
				}
				rates[i] = append(rates[i], run.Deliveries)
				b.ReportMetric(run.Deliveries, "deliveries/s")
			})
		}
	}
	median := func(v []float64) float64 {
		v = slices.Sorted(slices.Values(v))
		return v[len(v)/2]
	}
	if len(rates[0]) != rounds || len(rates[1]) != rounds {
		b.Fatal("a round failed")
	}
	var line strings.Builder
	for i, side := range sides {
		fmt.Fprintf(&line, "%s median %.0f deliveries/s %v; ", side.name, median(rates[i]), rates[i])
	}
	fmt.Fprintf(&line, "after/before %.2fx", median(rates[1])/median(rates[0]))
	b.Log(line.String())
	fmt.Println("cluster fan-out QoS 1, 30 subscribers over 3 nodes:", line.String())
}

// pprofConfig writes a config file that turns the profiler on.
func pprofConfig(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "pprof.yaml")
	if err := os.WriteFile(path, []byte("pprof: true\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// fetchProfile writes an 8 s CPU profile of the node serving HTTP at addr.
func fetchProfile(addr, path string) error {
	resp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=8")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile from %s: %s", addr, resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}
