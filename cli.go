package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/keyline-mq/keyline/broker"
)

// The admin subcommands talk to a running broker's admin API (/api/v1 on --http).

const cliUsage = `Usage:
  keyline groups [list]         list Key-Shared groups
  keyline groups show GROUP     one group in detail, with its members
  keyline groups delete GROUP   delete a group with its backlog and dead letters (it must have no members)
  keyline dlq list GROUP [--after ID] [--limit N]   list dead letters (paged by id)
  keyline dlq replay GROUP [--id ID | --all]        put one dead letter (default: all) back on the group's log
  keyline dlq purge GROUP (--id ID | --all)         delete one dead letter (or all)

GROUP is "<share>/<filter>" as in $share/<share>/<filter>, e.g. 'workers/orders/#' (quote it for the shell).

Flags:
`

// cliError is an error the server (or reaching it) caused: exit code 1.
type cliError struct{ msg string }

func (e cliError) Error() string { return e.msg }

type cliFlags struct {
	server, token string
	json, all     bool
	id            uint64
	after         uint64
	limit         int
	help          bool
}

func newCLIFlags(f *cliFlags) *pflag.FlagSet {
	fs := pflag.NewFlagSet("keyline", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.server, "server", "http://127.0.0.1:9883", "the broker's --http address")
	fs.StringVar(&f.token, "token", "", "bearer token of the admin API (default $KEYLINE_HTTP_TOKEN)")
	fs.BoolVar(&f.json, "json", false, "print the server's JSON instead of a table")
	fs.Uint64Var(&f.id, "id", 0, "dlq replay/purge: the dead letter's id")
	fs.BoolVar(&f.all, "all", false, "dlq replay/purge: every dead letter of the group")
	fs.Uint64Var(&f.after, "after", 0, "dlq list: list dead letters with ids after this one")
	fs.IntVar(&f.limit, "limit", 100, "dlq list: at most this many (1-1000)")
	fs.BoolVarP(&f.help, "help", "h", false, "show this help")
	return fs
}

// runCLI runs `keyline groups ...` or `keyline dlq ...`.
func runCLI(args []string, stdout, stderr io.Writer) int {
	err := cli(args, stdout)
	var ce cliError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "keyline: %v\n", err)
		return 1
	default:
		fmt.Fprintf(stderr, "keyline: %v (see keyline %s --help)\n", err, args[0])
		return 2
	}
}

func cli(args []string, stdout io.Writer) error {
	var f cliFlags
	fs := newCLIFlags(&f)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.help {
		fmt.Fprint(stdout, cliUsage+fs.FlagUsages())
		return nil
	}
	pos := fs.Args() // [groups|dlq, sub, GROUP...]
	cmd, sub := pos[0], ""
	if len(pos) > 1 {
		sub = pos[1]
	}
	var rest []string
	if len(pos) > 2 {
		rest = pos[2:]
	}
	if f.token == "" {
		f.token = os.Getenv("KEYLINE_HTTP_TOKEN")
	}
	given := func(name string) bool { return fs.Changed(name) }
	onlyFlags := func(allowed ...string) error {
		for _, n := range []string{"id", "all", "after", "limit"} {
			if given(n) && !strings.Contains(" "+strings.Join(allowed, " ")+" ", " "+n+" ") {
				return fmt.Errorf("--%s does not apply to %s %s", n, cmd, sub)
			}
		}
		return nil
	}
	group := func() (string, error) {
		switch len(rest) {
		case 0:
			return "", fmt.Errorf("%s %s needs a GROUP (e.g. 'workers/orders/#')", cmd, sub)
		case 1:
			return rest[0], nil
		}
		return "", fmt.Errorf("unexpected argument %q", rest[1])
	}
	c, err := newAdminClient(f.server, f.token)
	if err != nil {
		return err
	}

	switch cmd + " " + sub {
	case "groups ", "groups list":
		if len(rest) > 0 {
			return fmt.Errorf("unexpected argument %q", rest[0])
		}
		if err := onlyFlags(); err != nil {
			return err
		}
		var out struct {
			Groups []broker.GroupView `json:"groups"`
		}
		return c.do(stdout, f.json, http.MethodGet, "/api/v1/groups", nil, &out, func(w io.Writer) { printGroups(w, out.Groups) })
	case "groups show", "groups delete":
		name, err := group()
		if err != nil {
			return err
		}
		if err := onlyFlags(); err != nil {
			return err
		}
		q := url.Values{"group": {name}}
		if sub == "show" {
			var v broker.GroupView
			return c.do(stdout, f.json, http.MethodGet, "/api/v1/groups/detail", q, &v, func(w io.Writer) { printGroup(w, &v) })
		}
		var v broker.DeleteGroupResult
		return c.do(stdout, f.json, http.MethodDelete, "/api/v1/groups", q, &v, func(w io.Writer) {
			fmt.Fprintf(w, "deleted group %s (backlog %d, dead letters %d)\n", v.Deleted, v.Backlog, v.DeadLetters)
		})
	case "dlq list":
		name, err := group()
		if err != nil {
			return err
		}
		if err := onlyFlags("after", "limit"); err != nil {
			return err
		}
		if f.limit < 1 || f.limit > 1000 {
			return fmt.Errorf("--limit %d is not between 1 and 1000", f.limit)
		}
		q := url.Values{"group": {name}, "after": {strconv.FormatUint(f.after, 10)}, "limit": {strconv.Itoa(f.limit)}}
		var p broker.DeadLetterPage
		return c.do(stdout, f.json, http.MethodGet, "/api/v1/dlq", q, &p, func(w io.Writer) { printDeadLetters(w, &p) })
	case "dlq replay", "dlq purge":
		name, err := group()
		if err != nil {
			return err
		}
		if err := onlyFlags("id", "all"); err != nil {
			return err
		}
		q := url.Values{"group": {name}}
		switch {
		case given("id") && f.all:
			return errors.New("give --id or --all, not both")
		case given("id"):
			q.Set("id", strconv.FormatUint(f.id, 10))
		case sub == "purge" && !f.all:
			return errors.New("dlq purge needs --id ID, or --all to purge every dead letter of the group")
		}
		if sub == "replay" {
			var v broker.ReplayResult
			return c.do(stdout, f.json, http.MethodPost, "/api/v1/dlq/replay", q, &v, func(w io.Writer) { printReplay(w, &v) })
		}
		var v broker.PurgeResult
		return c.do(stdout, f.json, http.MethodPost, "/api/v1/dlq/purge", q, &v, func(w io.Writer) {
			fmt.Fprintf(w, "purged %d dead letter%s of %s\n", v.Purged, plural(v.Purged), v.Group)
		})
	case "dlq ":
		return errors.New("dlq needs list, replay or purge")
	}
	return fmt.Errorf("unknown command %q (want %s)", strings.TrimSpace(cmd+" "+sub),
		map[string]string{"groups": "groups list, show or delete", "dlq": "dlq list, replay or purge"}[cmd])
}

// adminClient calls a broker's admin API.
type adminClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

func newAdminClient(server, token string) (*adminClient, error) {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	u, err := url.Parse(strings.TrimRight(server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server %q is not an http(s) URL like http://127.0.0.1:9883", server)
	}
	// Replaying or purging a large dead-letter queue takes a while.
	return &adminClient{base: u, token: token, http: &http.Client{Timeout: 10 * time.Minute}}, nil
}

// do sends the request; on success it prints the raw JSON (asJSON) or decodes
// it into out and calls print; on failure it returns the server's error.
func (c *adminClient) do(w io.Writer, asJSON bool, method, path string, q url.Values, out any, print func(io.Writer)) error {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	req, err := http.NewRequest(method, u.String(), nil)
	if err != nil {
		return cliError{err.Error()}
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return cliError{fmt.Sprintf("cannot reach the broker at %s: %v", c.base, unwrapURLError(err))}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return cliError{fmt.Sprintf("%s %s: reading the answer: %v", method, path, err)}
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
			if !utf8.Valid(body) || len(e.Error) > 200 || e.Error == "" {
				e.Error = "unexpected answer"
			}
		}
		if resp.StatusCode == http.StatusUnauthorized && c.token == "" {
			e.Error = "the admin API needs a token: pass --token or set KEYLINE_HTTP_TOKEN"
		}
		return cliError{fmt.Sprintf("%s (HTTP %d)", e.Error, resp.StatusCode)}
	}
	if asJSON {
		if _, err := w.Write(body); err != nil {
			return cliError{err.Error()}
		}
		return nil
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(out); err != nil {
		return cliError{fmt.Sprintf("%s %s: the answer is not the JSON expected (is %s a keyline broker?): %v", method, path, c.base, err)}
	}
	print(w)
	return nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// --- output ---

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func rate(r *broker.GroupRates, f func(*broker.GroupRates) float64) string {
	if r == nil {
		return "-"
	}
	return strconv.FormatFloat(f(r), 'f', 1, 64)
}

func printGroups(w io.Writer, gs []broker.GroupView) {
	if len(gs) == 0 {
		fmt.Fprintln(w, "no groups")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tMEMBERS\tHEAD\tCURSOR\tBACKLOG\tLAG\tIN-FLIGHT\tBLOCKED\tBLOCKED-KEYS\tDEAD-LETTERS\tDROPPED\tACKED/S")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", g.Name, len(g.Members), g.Head, g.Cursor, g.Backlog, g.Lag,
			g.InFlight, g.Blocked, g.BlockedKeys, g.DeadLetters, g.Counters.Dropped+g.BacklogDropped,
			rate(g.Rates, func(r *broker.GroupRates) float64 { return r.Acked }))
	}
	_ = tw.Flush()
}

func printGroup(w io.Writer, g *broker.GroupView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("group", g.Name)
	row("share / filter", g.Share+" / "+g.Filter)
	row("created", g.Created.Local().Format(time.RFC3339))
	row("head / cursor", fmt.Sprintf("%d / %d (persisted %d)", g.Head, g.Cursor, g.PersistedCursor))
	row("backlog / lag", fmt.Sprintf("%d / %d", g.Backlog, g.Lag))
	row("in flight / blocked", fmt.Sprintf("%d / %d (%d keys blocked, %d poisoned)", g.InFlight, g.Blocked, g.BlockedKeys, g.PoisonedKeys))
	row("dead letters", g.DeadLetters)
	row("stored", fmt.Sprintf("%d messages, %d bytes", g.StoredMessages, g.StoredBytes))
	c := g.Counters
	row("delivered", fmt.Sprintf("%d (%d redeliveries), acked %d, nacks %d, rejects %d, timeouts %d, member losses %d",
		c.Delivered, c.Redeliveries, c.Acked, c.Nacks, c.Rejects, c.Timeouts, c.MemberLosses))
	row("resolved otherwise", fmt.Sprintf("dead-lettered %d, dropped %d, expired %d, skipped %d; backlog dropped %d, rejected %d",
		c.DeadLettered, c.Dropped, c.Expired, c.Skipped, g.BacklogDropped, g.BacklogRejected))
	row("qos 0", fmt.Sprintf("routed %d, dropped %d, skipped %d", g.QoS0.Routed, g.QoS0.Dropped, g.QoS0.Skipped))
	if r := g.Rates; r != nil {
		row("rates /s", fmt.Sprintf("published %.1f, delivered %.1f, acked %.1f, dead-lettered %.1f (over %.0fs)",
			r.Published, r.Delivered, r.Acked, r.DeadLettered, r.WindowSeconds))
	}
	if s := g.Settings; s != nil {
		row("settings", fmt.Sprintf("ack-timeout %s, max-deliveries %d, poison-policy %s, member-max-inflight %d, window %d",
			s.AckTimeout, s.MaxDeliveries, s.PoisonPolicy, s.MemberMaxInflight, s.Window))
	}
	row("members", len(g.PerMember))
	_ = tw.Flush()
	if len(g.PerMember) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tCONNECTED\tACTIVE\tQOS\tIN-FLIGHT\tLIMIT\tKEY-FILTERS")
	for _, m := range g.PerMember {
		filters := strings.Join(m.KeyFilters, ",")
		if filters == "" {
			filters = "*"
		}
		fmt.Fprintf(tw, "%s\t%t\t%t\t%d\t%d\t%d\t%s\n", m.ID, m.Connected, m.Active, m.QoS, m.InFlight, m.Limit, filters)
	}
	_ = tw.Flush()
}

func printDeadLetters(w io.Writer, p *broker.DeadLetterPage) {
	if len(p.DeadLetters) == 0 {
		fmt.Fprintf(w, "no dead letters in %s (total %d)\n", p.Group, p.Total)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEAD-AT\tKEY\tTOPIC\tATTEMPTS\tREASON\tPAYLOAD")
	for _, d := range p.DeadLetters {
		reason := fmt.Sprintf("0x%02x", d.ReasonCode)
		if d.ReasonCode == 0 {
			reason = "timeout/lost"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.DeadAt.Local().Format(time.RFC3339), clip(d.Key, 32), clip(d.Topic, 48),
			d.Attempts, reason, payloadPreview(&d))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d of %d dead letters", len(p.DeadLetters), p.Total)
	if p.More {
		fmt.Fprintf(w, "; more with --after %d", p.NextAfter)
	}
	fmt.Fprintln(w)
}

func payloadPreview(d *broker.DeadLetterView) string {
	if d.PayloadEncoding != "utf-8" {
		return fmt.Sprintf("(%d bytes binary)", d.PayloadSize)
	}
	return clip(strconv.Quote(d.Payload), 40)
}

func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func printReplay(w io.Writer, v *broker.ReplayResult) {
	fmt.Fprintf(w, "replayed %d dead letter%s of %s\n", v.Count, plural(v.Count), v.Group)
	if len(v.Replayed) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNEW-OFFSET\tKEY\tTOPIC")
	for _, r := range v.Replayed {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", r.ID, r.Offset, clip(r.Key, 32), clip(r.Topic, 48))
	}
	_ = tw.Flush()
	if v.Truncated {
		fmt.Fprintf(w, "(first %d listed)\n", len(v.Replayed))
	}
}
