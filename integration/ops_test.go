package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// The files operators install from dist/: alert rules, their unit tests,
// the Grafana dashboard and the systemd unit.
const (
	alertRules     = "../dist/prometheus/alerts.yml"
	alertRuleTests = "../dist/prometheus/alerts_test.yml"
	dashboardFile  = "../dist/grafana/keyline.json"
	serviceUnit    = "../dist/keyline.service"
	sampleConfig   = "../dist/keyline.yaml"
)

// scraped is what real scrapes exposed: metric name -> its label names.
type scraped map[string]map[string]bool

func (s scraped) add(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	for name, f := range families {
		labels := s[name]
		if labels == nil {
			labels = map[string]bool{}
			s[name] = labels
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
}

// has reports whether the scrapes exposed metric (a histogram's or
// summary's series under its family name).
func (s scraped) has(metric string) (map[string]bool, bool) {
	if l, ok := s[metric]; ok {
		return l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(metric, suffix); ok {
			if l, ok := s[base]; ok {
				return l, true
			}
		}
	}
	return nil, false
}

// A PromQL expression's metric names, and the label names it matches on,
// groups by or prints (legends and annotations).
var (
	metricRef   = regexp.MustCompile(`\b(keyline_[a-z0-9_]+|process_[a-z_]+|go_[a-z_]+|up)\b`)
	matcherRef  = regexp.MustCompile(`\{([^}]*)\}`)
	matcherName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRef = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	templateRef = regexp.MustCompile(`\{\{\s*\$?(?:labels\.)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}|\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// targetLabels are added by Prometheus to every series it scrapes.
var targetLabels = map[string]bool{"instance": true, "job": true}

// query is one expression a shipped file uses, with the labels its text
// (legend, annotations) prints.
type query struct {
	where, expr string
	printed     []string
}

func (q query) labels() []string {
	var out []string
	expr := strings.ReplaceAll(q.expr, "$__rate_interval", "5m")
	for _, m := range matcherRef.FindAllStringSubmatch(expr, -1) {
		for _, n := range matcherName.FindAllStringSubmatch(m[1], -1) {
			out = append(out, n[1])
		}
	}
	for _, m := range groupingRef.FindAllStringSubmatch(expr, -1) {
		for _, n := range strings.Split(m[1], ",") {
			if n = strings.TrimSpace(n); n != "" {
				out = append(out, n)
			}
		}
	}
	return append(out, q.printed...)
}

func printedLabels(texts ...string) []string {
	var out []string
	for _, s := range texts {
		for _, m := range templateRef.FindAllStringSubmatch(s, -1) {
			name := m[1] + m[2]
			if name != "value" && name != "humanize" {
				out = append(out, name)
			}
		}
	}
	return out
}

func alertQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	var out []query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			var texts []string
			for _, v := range r.Annotations {
				texts = append(texts, v)
			}
			out = append(out, query{"alert " + r.Alert, r.Expr, printedLabels(texts...)})
		}
	}
	return out
}

func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, query{"panel " + p.Title, tg.Expr, printedLabels(tg.LegendFormat)})
		}
	}
	for _, v := range d.Templating.List {
		// label_values(metric{...}, label): the label must exist on the metric.
		if def, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			i := strings.LastIndex(def, ",")
			out = append(out, query{"variable " + v.Name, def[:i], []string{strings.TrimSpace(strings.TrimSuffix(def[i+1:], ")"))}})
		}
	}
	if len(out) < 20 {
		t.Fatalf("%s: only %d queries", dashboardFile, len(out))
	}
	return out
}

// scrapeWithTraffic runs a single node and a cluster node with traffic on
// them (ordinary and shared subscriptions, QoS 0 and 1) and returns what
// their /metrics exposed.
func scrapeWithTraffic(t *testing.T) scraped {
	t.Helper()
	s := scraped{"up": {"instance": true, "job": true}} // Prometheus' own
	nc := natstest.Start(t, 1)
	cert, key, _ := mqtttest.SelfSigned(t, t.TempDir()) // a tls listener: its certificate's expiry is exposed
	for _, p := range []*proc{
		startKeyline(t, t.TempDir(), "--tls", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key),
		startKeyline(t, t.TempDir(), "--nats", strings.Join(nc.URLs(), ","), "--node-id", "ops-1", "--nats-replicas", "1"),
	} {
		sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "ops-sub", CleanStart: true, KeepAlive: 30})
		sub.Subscribe(t, paho.SubscribeOptions{Topic: "ops/#", QoS: 1}, paho.SubscribeOptions{Topic: "$share/ops/jobs/#", QoS: 1})
		pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "ops-pub", CleanStart: true, KeepAlive: 30})
		pub.Publish(t, &paho.Publish{Topic: "ops/a", QoS: 1, Payload: []byte("1")})
		pub.Publish(t, &paho.Publish{Topic: "ops/b", QoS: 0, Payload: []byte("2")})
		pub.Publish(t, &paho.Publish{Topic: "jobs/1", QoS: 1, Payload: []byte("3")})
		for range 3 {
			sub.Next(t)
		}
		s.add(t, "http://"+p.addrs["http"]+"/metrics")
		pub.Close()
		sub.Close()
	}
	return s
}

// TestDashboardAndAlertsMatchARealScrape checks that every metric and label
// the shipped alert rules and dashboard use exists in what a running
// keyline exposes (single node and cluster mode), so that a renamed metric
// cannot leave a silent alert or an empty panel behind.
func TestDashboardAndAlertsMatchARealScrape(t *testing.T) {
	s := scrapeWithTraffic(t)
	queries := append(alertQueries(t), dashboardQueries(t)...)
	used := map[string]bool{}
	for _, q := range queries {
		metrics := metricRef.FindAllString(q.expr, -1)
		if len(metrics) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
			continue
		}
		known := map[string]bool{}
		for _, m := range metrics {
			labels, ok := s.has(m)
			if !ok {
				t.Errorf("%s: metric %s is not in a real scrape", q.where, m)
				continue
			}
			used[m] = true
			for l := range labels {
				known[l] = true
			}
		}
		for _, l := range q.labels() {
			if !known[l] && !targetLabels[l] && !strings.HasPrefix(l, "__") {
				t.Errorf("%s: label %q is on none of %v in a real scrape", q.where, l, metrics)
			}
		}
	}
	var names []string
	for m := range used {
		names = append(names, m)
	}
	sort.Strings(names)
	t.Logf("%d queries use %d metrics found in a real scrape: %s", len(queries), len(names), strings.Join(names, " "))
}

// TestAlertRulesPassPromtool runs Prometheus' own checks of the rules and
// their unit tests (dist/prometheus/alerts_test.yml), as an operator's CI
// would. .ci/run installs promtool (Debian's prometheus package).
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
	}
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertRuleTests}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestServiceUnitVerifies checks the systemd unit with systemd-analyze
// verify, pointed at the built binary (verify checks that ExecStart exists).
func TestServiceUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd; .ci/run installs it)")
	}
	unit, err := os.ReadFile(serviceUnit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/keyline ") {
		t.Fatalf("%s: ExecStart does not run /usr/local/bin/keyline", serviceUnit)
	}
	path := filepath.Join(t.TempDir(), "keyline.service")
	text := strings.Replace(string(unit), "ExecStart=/usr/local/bin/keyline", "ExecStart="+keylineBin, 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"DynamicUser=yes", "StateDirectory=keyline", "ProtectSystem=strict", "NoNewPrivileges=yes", "LimitNOFILE="} {
		if !strings.Contains(text, want) {
			t.Errorf("%s lacks %s", serviceUnit, want)
		}
	}
}

// TestSampleConfigStarts runs the binary with the config the service unit
// points at, as the unit runs it (on loopback ports here).
func TestSampleConfigStarts(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--config", sampleConfig, "--tcp", "127.0.0.1:0", "--http", "127.0.0.1:0")
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "sample", CleanStart: true, KeepAlive: 30})
	c.Close()
}
