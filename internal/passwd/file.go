package passwd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A password file holds one user a line, "name:hash", as mosquitto's does
// (so a mosquitto password file reads unchanged). Blank lines and lines
// starting with '#' are kept but mean nothing. A name is not empty and holds
// no ':'; the hash is everything after the first ':'.

// MaxFileSize bounds a password file (64 MiB: about half a million users).
const MaxFileSize = 64 << 20

// MaxUsername bounds a user name (MQTT's own bound on a string).
const MaxUsername = 65535

// Entry is one user of a password file.
type Entry struct {
	User string
	Hash Hash
	Line int // 1-based line of the file
}

// File is a password file's content.
type File struct {
	Path    string
	Entries []Entry
	lines   []string // every line, for Set and Delete to keep the rest as it was
}

// ReadFile reads and parses a password file. Errors name the file and line.
func ReadFile(path string) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("password file: %w", err)
	}
	if st.Size() > MaxFileSize {
		return nil, fmt.Errorf("password file %s: %d bytes is larger than %d", path, st.Size(), MaxFileSize)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("password file: %w", err)
	}
	return ParseFile(path, data)
}

// ParseFile parses the content of a password file named path.
func ParseFile(path string, data []byte) (*File, error) {
	f := &File{Path: path}
	seen := map[string]int{}
	text := strings.TrimSuffix(string(data), "\n")
	if text == "" {
		return f, nil
	}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSuffix(line, "\r")
		f.lines = append(f.lines, line)
		n := i + 1
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok:
			return nil, fmt.Errorf("%s:%d: want user:hash", path, n)
		case user == "":
			return nil, fmt.Errorf("%s:%d: empty user name", path, n)
		case len(user) > MaxUsername:
			return nil, fmt.Errorf("%s:%d: user name longer than %d bytes", path, n, MaxUsername)
		case hash == "":
			return nil, fmt.Errorf("%s:%d: user %q has no password", path, n, clip(user))
		}
		if prev, dup := seen[user]; dup {
			return nil, fmt.Errorf("%s:%d: user %q again (first on line %d)", path, n, clip(user), prev)
		}
		h, err := Parse(hash)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: user %q: %w", path, n, clip(user), err)
		}
		seen[user] = n
		f.Entries = append(f.Entries, Entry{User: user, Hash: h, Line: n})
	}
	return f, nil
}

// Set gives user the encoded hash, in its line if it has one, else in a new
// line at the end.
func (f *File) Set(user, encoded string) error {
	if err := checkUser(user); err != nil {
		return err
	}
	h, err := Parse(encoded)
	if err != nil {
		return err
	}
	line := user + ":" + encoded
	for i, e := range f.Entries {
		if e.User == user {
			f.lines[e.Line-1] = line
			f.Entries[i].Hash = h
			return nil
		}
	}
	f.lines = append(f.lines, line)
	f.Entries = append(f.Entries, Entry{User: user, Hash: h, Line: len(f.lines)})
	return nil
}

// ErrNoUser is returned by Delete for a user the file does not hold.
var ErrNoUser = errors.New("passwd: no such user")

// Delete removes user's line.
func (f *File) Delete(user string) error {
	for i, e := range f.Entries {
		if e.User != user {
			continue
		}
		f.lines = append(f.lines[:e.Line-1], f.lines[e.Line:]...)
		f.Entries = append(f.Entries[:i], f.Entries[i+1:]...)
		for j := i; j < len(f.Entries); j++ {
			f.Entries[j].Line--
		}
		return nil
	}
	return fmt.Errorf("%w %q in %s", ErrNoUser, clip(user), f.Path)
}

func checkUser(user string) error {
	switch {
	case user == "":
		return errors.New("passwd: empty user name")
	case strings.ContainsAny(user, ":\n\r"):
		return fmt.Errorf("passwd: user name %q holds ':' or a line break", clip(user))
	case strings.HasPrefix(user, "#"):
		return fmt.Errorf("passwd: user name %q starts with '#' (a comment line)", clip(user))
	case len(user) > MaxUsername:
		return fmt.Errorf("passwd: user name longer than %d bytes", MaxUsername)
	}
	return nil
}

// Bytes returns the file's content.
func (f *File) Bytes() []byte {
	var b bytes.Buffer
	for _, l := range f.lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Write replaces the file at f.Path atomically (a temporary file in the same
// directory, synced, then renamed over it), keeping an existing file's mode;
// a new file is readable by its owner only.
func (f *File) Write() error {
	mode := fs.FileMode(0o600)
	if st, err := os.Stat(f.Path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("passwd: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(f.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("passwd: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("passwd: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("passwd: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("passwd: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("passwd: %w", err)
	}
	return nil
}
