package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// `keyline bridges`: the bridges of a running broker.
func init() {
	cliCommands = append(cliCommands,
		cliCommand{name: "bridges list", help: "list bridges to remote brokers, their state and figures",
			run: func(ctx context.Context, c *adminapi.Conn, _ *cliFlags, _ string) (func(io.Writer), []byte, error) {
				v, raw, err := adminapi.Call(ctx, c, adminapi.ListBridges())
				return func(w io.Writer) { printBridges(w, v.Bridges) }, raw, err
			}},
		cliCommand{name: "bridges show", usage: "NAME", help: "one bridge in detail", group: true, arg: "NAME",
			run: func(ctx context.Context, c *adminapi.Conn, _ *cliFlags, name string) (func(io.Writer), []byte, error) {
				v, raw, err := adminapi.Call(ctx, c, adminapi.Bridge(name))
				return func(w io.Writer) { printBridge(w, &v) }, raw, err
			}},
	)
	cliDefaults["bridges"] = "bridges list"
}

func printBridges(w io.Writer, bs []adminapi.BridgeView) {
	if len(bs) == 0 {
		fmt.Fprintln(w, "no bridges")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BRIDGE\tSTATE\tREMOTE\tQUEUED\tQUEUED-BYTES\tIN-FLIGHT\tSENT\tRECEIVED\tDROPPED\tDEAD-LETTERS\tLAST-ERROR")
	for _, b := range bs {
		remote := b.Address
		if remote == "" {
			remote = strings.Join(b.Addresses, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", term(b.Name), b.State, term(remote), b.QueuedMessages, b.QueuedBytes,
			b.InFlight, b.Sent, b.Received, b.Dropped, b.DeadLetters, clip(term(b.LastError), 60))
	}
	_ = tw.Flush()
}

func printBridge(w io.Writer, b *adminapi.BridgeView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("bridge", term(b.Name))
	state := b.State
	if b.ConnectedAt != nil {
		state += fmt.Sprintf(" to %s since %s", term(b.Address), b.ConnectedAt.Local().Format(time.RFC3339))
	}
	if b.Node != "" {
		state += " (lease on node " + term(b.Node) + ")"
	}
	row("state", state)
	row("remote", fmt.Sprintf("%s as %s, MQTT %s", term(strings.Join(b.Addresses, ", ")), term(b.ClientID), b.Protocol))
	for i, t := range b.Topics {
		k := ""
		if i == 0 {
			k = "topics"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k+":", term(t))
	}
	row("queued", fmt.Sprintf("%d messages, %d bytes in the log; %d in flight", b.QueuedMessages, b.QueuedBytes, b.InFlight))
	row("sent / received", fmt.Sprintf("%d / %d", b.Sent, b.Received))
	row("dropped", fmt.Sprintf("%d (%d looped back); remote refusals %d, dead letters %d; refused here %d", b.Dropped, b.Looped, b.Nacked, b.DeadLetters, b.Refused))
	row("connections", fmt.Sprintf("%d made, %d attempts failed", b.Connects, b.Failures))
	if b.LastError != "" {
		at := ""
		if b.LastErrorAt != nil {
			at = " at " + b.LastErrorAt.Local().Format(time.RFC3339)
		}
		row("last error", term(b.LastError)+at)
	}
	for i, g := range b.Groups {
		k := ""
		if i == 0 {
			k = "groups"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k+":", term(g))
	}
	_ = tw.Flush()
}
