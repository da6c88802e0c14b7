package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	xterm "golang.org/x/term"

	"github.com/keyline-mq/keyline/internal/passwd"
)

// maxPasswordInput bounds a password read from stdin.
const maxPasswordInput = 64 << 10

// runPasswd is `keyline passwd [-c | -D] [--hash argon2id|bcrypt] FILE USER`,
// mosquitto_passwd's work: it writes (or, with -D, deletes) USER's entry in
// the password file, asking for the password twice on a terminal, or reading
// one line from stdin otherwise.
func runPasswd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("keyline passwd", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	create := fs.BoolP("create", "c", false, "create the file (replacing one that exists)")
	del := fs.BoolP("delete", "D", false, "delete USER from the file")
	hash := fs.StringP("hash", "H", "argon2id", "hash to write: argon2id or bcrypt")
	help := fs.BoolP("help", "h", false, "show this help")
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "keyline: passwd: "+format+"\n", a...)
		return code
	}
	if err := fs.Parse(args); err != nil {
		return fail(2, "%v (see keyline passwd --help)", err)
	}
	if *help {
		fmt.Fprint(stdout, `Usage:
  keyline passwd [-c | -D] [--hash argon2id|bcrypt] FILE USER
      write USER's password hash into the password file FILE (mosquitto's format, which --password-file reads);
      the password is asked twice on a terminal, else read as one line from stdin

Flags:
`+fs.FlagUsages())
		return 0
	}
	if fs.NArg() != 2 {
		return fail(2, "want FILE USER (see keyline passwd --help)")
	}
	path, user := fs.Arg(0), fs.Arg(1)
	scheme, err := passwd.ParseScheme(*hash)
	if err != nil {
		return fail(2, "%v", err)
	}
	if *create && *del {
		return fail(2, "-c and -D do not go together")
	}
	var f *passwd.File
	if *create {
		f = &passwd.File{Path: path}
	} else if f, err = passwd.ReadFile(path); errors.Is(err, os.ErrNotExist) {
		return fail(1, "%s does not exist (-c creates it)", path)
	} else if err != nil {
		return fail(1, "%v", err)
	}
	if *del {
		if err := f.Delete(user); err != nil {
			return fail(1, "%v", err)
		}
		if err := f.Write(); err != nil {
			return fail(1, "%v", err)
		}
		return 0
	}
	pw, err := readPassword(stdin, stderr)
	if err != nil {
		return fail(1, "%v", err)
	}
	encoded, err := passwd.New(pw, scheme)
	if err != nil {
		return fail(1, "%v", err)
	}
	if err := f.Set(user, encoded); err != nil {
		return fail(2, "%v", err)
	}
	if err := f.Write(); err != nil {
		return fail(1, "%v", err)
	}
	return 0
}

// readPassword asks twice without echo when stdin is a terminal, and reads
// one line otherwise.
func readPassword(stdin io.Reader, prompt io.Writer) ([]byte, error) {
	if f, ok := stdin.(*os.File); ok && xterm.IsTerminal(int(f.Fd())) {
		fmt.Fprint(prompt, "Password: ")
		pw, err := xterm.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return nil, err
		}
		fmt.Fprint(prompt, "Reenter password: ")
		again, err := xterm.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(pw, again) {
			return nil, errors.New("the passwords do not match")
		}
		if len(pw) == 0 {
			return nil, errors.New("empty password")
		}
		return pw, nil
	}
	r := bufio.NewReader(io.LimitReader(stdin, maxPasswordInput+1))
	line, err := r.ReadBytes('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read the password from stdin: %w", err)
	}
	if len(line) > maxPasswordInput {
		return nil, fmt.Errorf("password longer than %d bytes", maxPasswordInput)
	}
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	if len(line) == 0 {
		return nil, errors.New("empty password on stdin")
	}
	return line, nil
}
