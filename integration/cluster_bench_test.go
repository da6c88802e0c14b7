package integration

import (
	"fmt"
	"os"
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
//	KEYLINE_BEFORE=/tmp/keyline-before KEYLINE_BENCH_ROUNDS=3 \
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
	const subs, msgs = 30, 3000
	sides := []struct{ name, bin string }{{"before", before}, {"after", keylineBin}}
	rates := make([][]float64, len(sides))
	for r := range rounds {
		for i, side := range sides {
			b.Run(fmt.Sprintf("round%d/%s", r+1, side.name), func(b *testing.B) {
				nc := natstest.Start(b, 3)
				var addrs []string
				for j, u := range nc.URLs() {
					// One after the other: nodes started together did not
					// come up before issue 22 (c8dc5e6 is such a build).
					p := launchBinary(b, side.bin, 0, b.TempDir(),
						"--nats", u, "--node-id", fmt.Sprintf("bench-%d", j), "--nats-replicas", "3")
					p.waitStarted(b, startTimeout)
					addrs = append(addrs, p.addrs["tcp"])
				}
				run := mqtttest.MeasureFanout(b, mqtttest.FanoutTarget{Subs: addrs, Pub: addrs[0]}, subs, msgs, 1)
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
