package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spf13/pflag"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/persistence"
)

// runBackup runs `keyline backup`: it asks a running broker for an online
// backup (POST /api/v1/backup) and writes it into a new directory,
// verified against its manifest. Exit 0: a complete, verified backup; 1: no
// backup (the directory holds what arrived, which restore refuses); 2: a
// usage mistake.
func runBackup(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("keyline backup", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	server := fs.String("server", "http://127.0.0.1:9883", "the broker's --http address")
	token := fs.String("token", "", "bearer token of the admin API (default $KEYLINE_HTTP_TOKEN)")
	to := fs.String("to", "", "directory to write the backup into (new, or empty)")
	help := fs.BoolP("help", "h", false, "show this help")
	usage := "Usage:\n  keyline backup --to DIR [--server URL] [--token T]\ttake an online backup of a running broker's data dir\n\nFlags:\n"
	if code, ok := parseSubcommand("backup", fs, args, stdout, stderr, help, usage); !ok {
		return code
	}
	if *to == "" {
		fmt.Fprintln(stderr, "keyline: backup: --to DIR is required (see keyline backup --help)")
		return 2
	}
	if *token == "" {
		*token = os.Getenv("KEYLINE_HTTP_TOKEN")
	}
	c, err := adminapi.Dial(*server, *token)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: backup: --server: %v\n", err)
		return 2
	}
	body, err := c.Stream(context.Background(), http.MethodPost, adminapi.PathBackup, nil)
	var se *adminapi.StatusError
	switch {
	case errors.As(err, &se) && se.NoToken:
		fmt.Fprintf(stderr, "keyline: backup: the admin API needs a token: pass --token or set KEYLINE_HTTP_TOKEN (HTTP %d)\n", se.Status)
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "keyline: backup: %v\n", term(err.Error()))
		return 1
	}
	defer body.Close()
	m, err := persistence.ExtractBackup(body, *to)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: backup: %v\n", term(err.Error()))
		return 1
	}
	var size int64
	for _, f := range m.Files {
		size += f.Size
	}
	fmt.Fprintf(stdout, "backup of commit %d (%s) in %s: %d files, %d bytes, verified\n",
		m.Commit, m.Created.Format("2006-01-02 15:04:05Z07:00"), term(*to), len(m.Files), size)
	return 0
}

// runRestore runs `keyline restore`: it verifies a backup directory and
// copies it into an empty data dir (keyline must not be running on it).
func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("keyline restore", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	from := fs.String("from", "", "the backup directory (written by keyline backup)")
	dataDir := fs.String("data-dir", broker.DefaultConfig().DataDir, "the data dir to restore into (new, or empty)")
	help := fs.BoolP("help", "h", false, "show this help")
	usage := "Usage:\n  keyline restore --from DIR [--data-dir D]\trestore a backup into an empty data dir\n\nFlags:\n"
	if code, ok := parseSubcommand("restore", fs, args, stdout, stderr, help, usage); !ok {
		return code
	}
	if *from == "" {
		fmt.Fprintln(stderr, "keyline: restore: --from DIR is required (see keyline restore --help)")
		return 2
	}
	m, err := persistence.Restore(*from, *dataDir)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: restore: %v\n", term(err.Error()))
		return 1
	}
	fmt.Fprintf(stdout, "restored commit %d (%s) into %s: %d files\n", m.Commit, m.Created.Format("2006-01-02 15:04:05Z07:00"), term(*dataDir), len(m.Files))
	return 0
}

// parseSubcommand parses a subcommand's flags; ok is false when the caller
// should return code (help printed, or a usage mistake reported).
func parseSubcommand(name string, fs *pflag.FlagSet, args []string, stdout, stderr io.Writer, help *bool, usage string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil || len(fs.Args()) > 0 {
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		fmt.Fprintf(stderr, "keyline: %s: %v (see keyline %s --help)\n", name, err, name)
		return 2, false
	}
	if *help {
		fmt.Fprint(stdout, usage+fs.FlagUsages())
		return 0, false
	}
	return 0, true
}
