package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/enum"
	"github.com/keyline-mq/keyline/persistence"
)

// The admin subcommands talk to a running broker's admin API (/api/v1 on
// --http) through adminapi, the package the broker serves it from.

// cliCommand is one admin subcommand.
type cliCommand struct {
	name  string   // "groups list"
	usage string   // arguments and flags, for the usage text
	help  string   // one line
	group bool     // takes a GROUP argument (or the one arg names)
	arg   string   // the argument's name when not GROUP
	flags []string // command-specific flags it accepts (of id, all, after, limit)
	run   func(ctx context.Context, c *adminapi.Conn, f *cliFlags, group string) (print func(io.Writer), raw []byte, err error)
}

// cliCommands is every admin subcommand, in the order the usage lists them.
var cliCommands = []cliCommand{
	{name: "groups list", help: "list Key-Shared groups",
		run: func(ctx context.Context, c *adminapi.Conn, _ *cliFlags, _ string) (func(io.Writer), []byte, error) {
			v, raw, err := adminapi.Call(ctx, c, adminapi.ListGroups())
			return func(w io.Writer) { printGroups(w, v.Groups) }, raw, err
		}},
	{name: "groups show", usage: "GROUP", help: "one group in detail, with its members", group: true,
		run: func(ctx context.Context, c *adminapi.Conn, _ *cliFlags, group string) (func(io.Writer), []byte, error) {
			v, raw, err := adminapi.Call(ctx, c, adminapi.GroupDetail(group))
			return func(w io.Writer) { printGroup(w, &v) }, raw, err
		}},
	{name: "groups delete", usage: "GROUP", help: "delete a group with its backlog and dead letters (it must have no members)", group: true,
		run: func(ctx context.Context, c *adminapi.Conn, _ *cliFlags, group string) (func(io.Writer), []byte, error) {
			v, raw, err := adminapi.Call(ctx, c, adminapi.DeleteGroup(group))
			return func(w io.Writer) {
				fmt.Fprintf(w, "deleted group %s (backlog %d, dead letters %d)\n", term(v.Deleted), v.Backlog, v.DeadLetters)
			}, raw, err
		}},
	{name: "dlq list", usage: "GROUP [--after ID] [--limit N]", help: "list dead letters (paged by id)", group: true, flags: []string{"after", "limit"},
		run: func(ctx context.Context, c *adminapi.Conn, f *cliFlags, group string) (func(io.Writer), []byte, error) {
			if f.limit < 1 || f.limit > adminapi.MaxDLQLimit {
				return nil, nil, usageError{fmt.Errorf("--limit %d is not between 1 and %d", f.limit, adminapi.MaxDLQLimit)}
			}
			v, raw, err := adminapi.Call(ctx, c, adminapi.DeadLetters(group, f.after, f.limit))
			return func(w io.Writer) { printDeadLetters(w, &v) }, raw, err
		}},
	{name: "dlq show", usage: "GROUP --id ID", help: "one dead letter in full (dlq list shows previews)", group: true, flags: []string{"id"},
		run: func(ctx context.Context, c *adminapi.Conn, f *cliFlags, group string) (func(io.Writer), []byte, error) {
			if !f.idGiven {
				return nil, nil, usageError{errors.New("dlq show needs --id ID")}
			}
			v, raw, err := adminapi.Call(ctx, c, adminapi.DeadLetter(group, f.id))
			return func(w io.Writer) { printDeadLetter(w, &v) }, raw, err
		}},
	{name: "dlq replay", usage: "GROUP [--id ID | --all]", help: "put one dead letter (default: all) back on the group's log", group: true, flags: []string{"id", "all"},
		run: func(ctx context.Context, c *adminapi.Conn, f *cliFlags, group string) (func(io.Writer), []byte, error) {
			if f.idGiven && f.all {
				return nil, nil, usageError{errors.New("give --id or --all, not both")}
			}
			v, raw, err := adminapi.Call(ctx, c, adminapi.Replay(group, f.id, !f.idGiven))
			return func(w io.Writer) { printReplay(w, &v) }, raw, err
		}},
	{name: "dlq purge", usage: "GROUP (--id ID | --all)", help: "delete one dead letter (or all)", group: true, flags: []string{"id", "all"},
		run: func(ctx context.Context, c *adminapi.Conn, f *cliFlags, group string) (func(io.Writer), []byte, error) {
			switch {
			case f.idGiven && f.all:
				return nil, nil, usageError{errors.New("give --id or --all, not both")}
			case !f.idGiven && !f.all:
				return nil, nil, usageError{errors.New("dlq purge needs --id ID, or --all to purge every dead letter of the group")}
			}
			v, raw, err := adminapi.Call(ctx, c, adminapi.Purge(group, f.id, f.all))
			return func(w io.Writer) {
				fmt.Fprintf(w, "purged %d dead letter%s of %s\n", v.Purged, plural(v.Purged), term(v.Group))
			}, raw, err
		}},
}

// cliDefaults maps a command word given alone to its default subcommand.
var cliDefaults = map[string]string{"groups": "groups list"}

func cliUsage() string {
	var b strings.Builder
	b.WriteString("Usage:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	for _, c := range cliCommands {
		fmt.Fprintf(tw, "  keyline %s %s\t%s\n", c.name, c.usage, c.help)
	}
	_ = tw.Flush()
	b.WriteString(`
GROUP is "<share>/<filter>" as in $share/<share>/<filter>, e.g. 'workers/orders/#' (quote it for the shell).

Flags:
`)
	return b.String()
}

// cliFlags are the flags of every admin subcommand.
type cliFlags struct {
	server, token string
	json, all     bool
	id            uint64
	idGiven       bool
	after         uint64
	limit         int
	help          bool
}

// commandFlags are the flags only some commands take.
var commandFlags = []string{"id", "all", "after", "limit"}

func newCLIFlags(f *cliFlags) *pflag.FlagSet {
	fs := pflag.NewFlagSet("keyline", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.server, "server", "http://127.0.0.1:9883", "the broker's --http address")
	fs.StringVar(&f.token, "token", "", "bearer token of the admin API (default $KEYLINE_HTTP_TOKEN)")
	fs.BoolVar(&f.json, "json", false, "print the server's JSON instead of a table")
	fs.Uint64Var(&f.id, "id", 0, "dlq show/replay/purge: the dead letter's id")
	fs.BoolVar(&f.all, "all", false, "dlq replay/purge: every dead letter of the group")
	fs.Uint64Var(&f.after, "after", 0, "dlq list: list dead letters with ids after this one")
	fs.IntVar(&f.limit, "limit", adminapi.DefaultDLQLimit, fmt.Sprintf("dlq list: at most this many (1-%d)", adminapi.MaxDLQLimit))
	fs.BoolVarP(&f.help, "help", "h", false, "show this help")
	return fs
}

// runCheck runs `keyline check`: the offline check of a data dir (the
// broker must be stopped). Exit code 0: nothing damaged; 1: damage found
// (each problem named), or the check could not run; 2: a usage mistake.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("keyline check", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dataDir := fs.String("data-dir", broker.DefaultConfig().DataDir, "the data dir to check (keyline must not be running on it)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	help := fs.BoolP("help", "h", false, "show this help")
	usage := "Usage:\n  keyline check [--data-dir DIR] [--json]\tverify keyline.db (bbolt's check, every group's records) and every segment frame's checksum, offline\n\nFlags:\n"
	if code, ok := parseSubcommand("check", fs, args, stdout, stderr, help, usage); !ok {
		return code
	}
	rep, err := persistence.CheckDir(*dataDir)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: check: %v\n", term(err.Error()))
		return 1
	}
	if *asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		printCheck(stdout, rep)
	}
	if len(rep.Problems) > 0 {
		fmt.Fprintf(stderr, "keyline: check: %d problem%s in %s\n", len(rep.Problems), plural(len(rep.Problems)), term(rep.Dir))
		return 1
	}
	return 0
}

func printCheck(w io.Writer, r *persistence.CheckReport) {
	var kinds []string
	for k, n := range r.Sessions {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	format := "unreadable"
	if r.Format > 0 {
		format = fmt.Sprintf("data format %d", r.Format)
	}
	fmt.Fprintf(w, "%s: keyline.db %s; %d segments (%d bytes); %d groups; session records: %s\n",
		term(r.Dir), format, r.Segments, r.SegmentBytes, len(r.Groups), strings.Join(kinds, ", "))
	if len(r.Groups) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP\tHEAD\tCURSOR\tREADABLE\tLOST\tLOST-BEFORE\tDEAD-LETTERS\tQUARANTINED")
		for _, g := range r.Groups {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", term(g.Name), g.Head, g.Cursor, g.Readable, g.Lost, g.LostBefore, g.DeadLetters, g.Quarantined)
		}
		_ = tw.Flush()
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", term(n))
	}
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "no damage found")
		return
	}
	fmt.Fprintln(w, "damage:")
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %s\n", term(p))
	}
}

// cliError is an error the server (or reaching it) caused: exit code 1.
type cliError struct{ msg string }

func (e cliError) Error() string { return e.msg }

// runCLI runs `keyline groups ...`, `keyline dlq ...` or `keyline bridges ...`.
func runCLI(args []string, stdout, stderr io.Writer) int {
	err := cli(args, stdout)
	var ce cliError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "keyline: %v\n", term(err.Error()))
		return 1
	default:
		fmt.Fprintf(stderr, "keyline: %v (see keyline %s --help)\n", term(err.Error()), args[0])
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
		fmt.Fprint(stdout, cliUsage()+fs.FlagUsages())
		return nil
	}
	pos := fs.Args() // [groups|dlq, sub, GROUP...]
	name := strings.Join(pos[:min(2, len(pos))], " ")
	if d, ok := cliDefaults[name]; ok {
		name = d
	}
	var cmd *cliCommand
	for i := range cliCommands {
		if cliCommands[i].name == name {
			cmd = &cliCommands[i]
		}
	}
	if cmd == nil {
		var subs []string
		for _, c := range cliCommands {
			if w, sub, _ := strings.Cut(c.name, " "); w == pos[0] {
				subs = append(subs, sub)
			}
		}
		if len(pos) == 1 {
			return fmt.Errorf("%s needs %s", pos[0], enum.Names(subs))
		}
		return fmt.Errorf("unknown command %q (want %s %s)", name, pos[0], enum.Names(subs))
	}
	rest := pos[min(2, len(pos)):]
	var group string
	switch {
	case cmd.group && len(rest) == 0 && cmd.arg != "":
		return fmt.Errorf("%s needs a %s", cmd.name, cmd.arg)
	case cmd.group && len(rest) == 0:
		return fmt.Errorf("%s needs a GROUP (e.g. 'workers/orders/#')", cmd.name)
	case cmd.group:
		group, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q", rest[0])
	}
	for _, n := range commandFlags {
		if fs.Changed(n) && !contains(cmd.flags, n) {
			return fmt.Errorf("--%s does not apply to %s", n, cmd.name)
		}
	}
	f.idGiven = fs.Changed("id")
	if f.token == "" {
		f.token = os.Getenv("KEYLINE_HTTP_TOKEN")
	}
	c, err := adminapi.Dial(f.server, f.token)
	if err != nil {
		return fmt.Errorf("--server: %w", err)
	}
	print, raw, err := cmd.run(context.Background(), c, &f, group)
	var se *adminapi.StatusError
	switch {
	case errors.As(err, new(usageError)):
		return err
	case errors.As(err, &se) && se.NoToken:
		return cliError{fmt.Sprintf("the admin API needs a token: pass --token or set KEYLINE_HTTP_TOKEN (HTTP %d)", se.Status)}
	case err != nil:
		return cliError{err.Error()}
	case f.json:
		_, err := stdout.Write(raw)
		return err
	}
	print(stdout)
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// term makes s safe to print on a terminal: names, keys and topics come
// from clients, and control characters (escape sequences) are shown quoted.
func term(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || (unicode.IsControl(r) && r != '\t') || r == 0x7f {
			q := strconv.QuoteToGraphic(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

// --- output ---

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func rate(r *adminapi.GroupRates, f func(*adminapi.GroupRates) float64) string {
	if r == nil {
		return "-"
	}
	return strconv.FormatFloat(f(r), 'f', 1, 64)
}

func printGroups(w io.Writer, gs []adminapi.GroupView) {
	if len(gs) == 0 {
		fmt.Fprintln(w, "no groups")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tMEMBERS\tHEAD\tCURSOR\tBACKLOG\tLAG\tIN-FLIGHT\tBLOCKED\tBLOCKED-KEYS\tDEAD-LETTERS\tDROPPED\tACKED/S")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", term(g.Name), len(g.Members), g.Head, g.Cursor, g.Backlog, g.Lag,
			g.InFlight, g.Blocked, g.BlockedKeys, g.DeadLetters, g.Counters.Dropped+g.BacklogDropped,
			rate(g.Rates, func(r *adminapi.GroupRates) float64 { return r.Acked }))
	}
	_ = tw.Flush()
}

func printGroup(w io.Writer, g *adminapi.GroupView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("group", term(g.Name))
	row("share / filter", term(g.Share)+" / "+term(g.Filter))
	row("created", g.Created.Local().Format(time.RFC3339))
	row("head / cursor", fmt.Sprintf("%d / %d (persisted %d)", g.Head, g.Cursor, g.PersistedCursor))
	row("backlog / lag", fmt.Sprintf("%d / %d", g.Backlog, g.Lag))
	row("in flight / blocked", fmt.Sprintf("%d / %d (%d keys blocked, %d poisoned, %d waiting for an eligible member)", g.InFlight, g.Blocked, g.BlockedKeys, g.PoisonedKeys, g.UnroutableKeys))
	row("dead letters", g.DeadLetters)
	row("stored", fmt.Sprintf("%d messages, %d bytes", g.StoredMessages, g.StoredBytes))
	if g.Lost > 0 || g.Quarantined > 0 {
		row("damaged", fmt.Sprintf("%d messages lost to damaged segments, %d undecodable records quarantined", g.Lost, g.Quarantined))
	}
	c := g.Counters
	row("delivered", fmt.Sprintf("%d (%d redeliveries), acked %d, nacks %d, rejects %d, timeouts %d, member losses %d",
		c.Delivered, c.Redeliveries, c.Acked, c.Nacks, c.Rejects, c.Timeouts, c.MemberLosses))
	row("resolved otherwise", fmt.Sprintf("dead-lettered %d, dropped %d, expired %d; backlog dropped %d, rejected %d",
		c.DeadLettered, c.Dropped, c.Expired, g.BacklogDropped, g.BacklogRejected))
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
		filters := term(strings.Join(m.KeyFilters, ","))
		if filters == "" {
			filters = "*"
		}
		fmt.Fprintf(tw, "%s\t%t\t%t\t%d\t%d\t%d\t%s\n", term(m.ID), m.Connected, m.Active, m.QoS, m.InFlight, m.Limit, filters)
	}
	_ = tw.Flush()
}

func printDeadLetters(w io.Writer, p *adminapi.DeadLetterPage) {
	if len(p.DeadLetters) == 0 {
		fmt.Fprintf(w, "no dead letters in %s (total %d)\n", term(p.Group), p.Total)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEAD-AT\tKEY\tTOPIC\tATTEMPTS\tREASON\tPAYLOAD")
	for _, d := range p.DeadLetters {
		reason := fmt.Sprintf("0x%02x", d.ReasonCode)
		if d.ReasonCode == 0 {
			reason = "timeout/lost"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.DeadAt.Local().Format(time.RFC3339), clip(term(d.Key), 32), clip(term(d.Topic), 48),
			d.Attempts, reason, payloadPreview(&d))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d of %d dead letters", len(p.DeadLetters), p.Total)
	if p.More {
		fmt.Fprintf(w, "; more with --after %d", p.NextAfter)
	}
	fmt.Fprintln(w)
}

func printDeadLetter(w io.Writer, d *adminapi.DeadLetterView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%d\n", d.ID)
	fmt.Fprintf(tw, "key\t%s\n", term(d.Key))
	fmt.Fprintf(tw, "topic\t%s\n", term(d.Topic))
	fmt.Fprintf(tw, "attempts\t%d\n", d.Attempts)
	fmt.Fprintf(tw, "reason\t0x%02x %s\n", d.ReasonCode, d.Reason)
	fmt.Fprintf(tw, "dead at\t%s\n", d.DeadAt.Local().Format(time.RFC3339))
	for _, u := range d.UserProperties {
		fmt.Fprintf(tw, "user property\t%s=%s\n", term(u.Key), term(u.Value))
	}
	fmt.Fprintf(tw, "payload\t%d bytes, %s\n", d.PayloadSize, d.PayloadEncoding)
	_ = tw.Flush()
	if d.PayloadEncoding == "utf-8" {
		fmt.Fprintln(w, term(d.Payload))
	} else {
		fmt.Fprintln(w, d.Payload)
	}
}

func payloadPreview(d *adminapi.DeadLetterView) string {
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

func printReplay(w io.Writer, v *adminapi.ReplayResult) {
	fmt.Fprintf(w, "replayed %d dead letter%s of %s\n", v.Count, plural(v.Count), term(v.Group))
	if len(v.Replayed) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNEW-OFFSET\tKEY\tTOPIC")
	for _, r := range v.Replayed {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", r.ID, r.Offset, clip(term(r.Key), 32), clip(term(r.Topic), 48))
	}
	_ = tw.Flush()
	if v.Truncated {
		fmt.Fprintf(w, "(first %d listed)\n", len(v.Replayed))
	}
}
