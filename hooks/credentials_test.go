package hooks

import (
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"golang.org/x/crypto/bcrypt"

	"github.com/keyline-mq/keyline/internal/passwd"
)

// newHash hashes pw: bcrypt at its lowest cost, 4 (the default, 10, takes
// seconds under the race detector), argon2id as keyline passwd does.
func newHash(t *testing.T, pw string, s passwd.Scheme) string {
	t.Helper()
	if s == passwd.Bcrypt {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	h, err := passwd.New([]byte(pw), s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCredentials(t *testing.T) {
	ledger := &auth.Ledger{Users: auth.Users{
		"plain": {Username: "plain", Password: "pw"},
		"bcr":   {Password: auth.RString(newHash(t, "bpw", passwd.Bcrypt))},
		"gone":  {Password: "x", Disallow: true},
	}}
	file, err := passwd.ParseFile("pw.txt", []byte("# users\nargon:"+newHash(t, "apw", passwd.Argon2id)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCredentials(ledger, file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.PlainUsers, ",") != "gone,plain" {
		t.Errorf("plain-text users %v, want gone and plain", c.PlainUsers)
	}
	for _, tc := range []struct {
		user, pw string
		ok       bool
	}{
		{"plain", "pw", true}, {"plain", "no", false},
		{"bcr", "bpw", true}, {"bcr", "pw", false},
		{"argon", "apw", true}, {"argon", "bpw", false},
		{"gone", "x", false}, {"nobody", "pw", false}, {"", "", false},
	} {
		if _, ok := c.Authenticate("c", tc.user, "127.0.0.1:1", []byte(tc.pw)); ok != tc.ok {
			t.Errorf("%s/%s: %v, want %v", tc.user, tc.pw, ok, tc.ok)
		}
	}
	// An unknown user costs a verification of the costliest scheme present.
	if c.dummy.Scheme() != passwd.Argon2id && c.dummy.Scheme() != passwd.Bcrypt {
		t.Errorf("dummy hash scheme %v, want one of the hashes present", c.dummy.Scheme())
	}

	a, ok := c.Authenticate("c", "argon", "127.0.0.1:1", []byte("apw"))
	if !ok {
		t.Fatal("argon did not authenticate")
	}
	if !c.stillValid(a, "c", "127.0.0.1:1") {
		t.Error("valid under the credentials it authenticated with")
	}
	rehashed, _ := passwd.ParseFile("pw.txt", []byte("argon:"+newHash(t, "apw", passwd.Argon2id)+"\n"))
	c2, err := NewCredentials(nil, rehashed)
	if err != nil {
		t.Fatal(err)
	}
	if c2.stillValid(a, "c", "127.0.0.1:1") {
		t.Error("still valid after its hash changed")
	}
	c3, _ := NewCredentials(nil, nil)
	if c3.stillValid(a, "c", "127.0.0.1:1") {
		t.Error("still valid after the user was removed")
	}

	dup, _ := passwd.ParseFile("pw.txt", []byte("bcr:"+newHash(t, "x", passwd.Bcrypt)+"\n"))
	if _, err := NewCredentials(ledger, dup); err == nil || !strings.Contains(err.Error(), "pw.txt:1") {
		t.Errorf("a user in both the config and the file: %v, want an error naming pw.txt:1", err)
	}
}
