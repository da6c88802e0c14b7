package hooks

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/auth"

	"github.com/keyline-mq/keyline/internal/passwd"
)

// Credentials decide who may connect with a user name and password: the
// users of the auth ledger (their password fields hold hashes, see package
// passwd) and of a password file, then the ledger's auth rules, as mochi's
// ledger does (a known user whose password does not verify falls through to
// the rules). A Credentials is built whole and never changed: a reload
// builds a new one.
//
// Timing: a user that does not exist (or has no password) costs one
// verification of a dummy hash with the scheme and parameters of the
// costliest hash present, so a wrong password and an unknown user take the
// same time when the hashes share their parameters (what `keyline passwd`
// and mosquitto_passwd write). Verifications run at most verifySlots at a
// time, so a flood of CONNECTs queues instead of allocating argon2id's
// memory for each at once.
type Credentials struct {
	// JWT, when set, verifies passwords shaped as JSON Web Tokens (jwt.go).
	JWT   *JWTVerifier
	users map[string]credUser
	rules auth.AuthRules
	dummy passwd.Hash
	// PlainUsers are the users whose password is stored in plain text, for
	// the caller to warn about.
	PlainUsers []string
}

type credUser struct {
	hash     passwd.Hash // zero: no password (never verifies)
	disallow bool
}

// verifySlots bounds the password verifications running at once.
var verifySlots = make(chan struct{}, max(2, runtime.GOMAXPROCS(0)))

// NewCredentials builds the credentials of a ledger's users and auth rules
// and of a password file's users (either may be nil). A user may have its
// password in one of them only.
func NewCredentials(ledger *auth.Ledger, file *passwd.File) (*Credentials, error) {
	c := &Credentials{users: map[string]credUser{}}
	var costliest passwd.Hash // not Valid while no user has a password
	consider := func(h passwd.Hash) {
		if !costliest.Valid() || h.Cost() > costliest.Cost() {
			costliest = h
		}
	}
	if ledger != nil {
		for name, u := range ledger.Users {
			if u.Username != "" && string(u.Username) != name {
				return nil, fmt.Errorf("auth.users.%s: username %q differs from the key it is under", clip(name), clip(string(u.Username)))
			}
			cu := credUser{disallow: u.Disallow}
			if u.Password != "" {
				h, err := passwd.Parse(string(u.Password))
				if err != nil {
					return nil, fmt.Errorf("auth.users.%s.password: %w", clip(name), err)
				}
				cu.hash = h
				consider(h)
				if h.Plain() {
					c.PlainUsers = append(c.PlainUsers, name)
				}
			}
			c.users[name] = cu
		}
		c.rules = ledger.Auth
	}
	if file != nil {
		for _, e := range file.Entries {
			cu := c.users[e.User]
			if cu.hash.Valid() {
				return nil, fmt.Errorf("%s:%d: user %q also has a password in the config file's auth.users", file.Path, e.Line, clip(e.User))
			}
			cu.hash = e.Hash
			c.users[e.User] = cu
			consider(e.Hash)
			if e.Hash.Plain() {
				c.PlainUsers = append(c.PlainUsers, e.User)
			}
		}
	}
	slices.Sort(c.PlainUsers)
	if costliest.Valid() {
		c.dummy = costliest.Dummy()
	} // else the zero Hash: no user has a password, so there is no timing to hide
	return c, nil
}

// authn says how a client authenticated, for re-checking it on reload.
type authn struct {
	kind authnKind
	user string
	hash passwd.Hash   // authnUser: the hash its password verified against
	rule auth.AuthRule // authnRule: the rule that let it in
	// authnJWT: the token (a copy), when it expires, the ACL it carries.
	token string
	exp   time.Time
	acl   []aclFilter
}

type authnKind uint8

const (
	authnOpen authnKind = iota // no authentication configured
	authnUser                  // a user's password
	authnRule                  // an auth rule
	authnCert                  // a client certificate's identity
	authnJWT                   // a JSON Web Token
)

// Authenticate reports whether a client may connect with these credentials, and how.
func (c *Credentials) Authenticate(clientID, username, remote string, password []byte) (authn, bool) {
	if c.JWT != nil && looksLikeJWT(password) {
		token := string(password) // a copy: kept past the packet
		user, exp, acl, err := c.JWT.verify(token, time.Now())
		if err != nil || (username != "" && username != user) {
			return authn{}, false
		}
		return authn{kind: authnJWT, user: user, token: token, exp: exp, acl: acl}, !c.disallowed(user)
	}
	u, ok := c.users[username]
	hash := c.dummy
	if ok && u.hash.Valid() {
		hash = u.hash
	} else {
		ok = false
	}
	verifySlots <- struct{}{}
	match := hash.Verify(password)
	<-verifySlots
	if ok && match {
		return authn{kind: authnUser, user: username, hash: u.hash}, !u.disallow
	}
	for _, rule := range c.rules {
		if rule.Client.Matches(clientID) && rule.Username.Matches(username) &&
			rule.Password.Matches(string(password)) && rule.Remote.Matches(remote) {
			return authn{kind: authnRule, user: username, rule: rule}, rule.Allow
		}
	}
	return authn{}, false
}

// stillValid reports whether a client that authenticated as a says may
// stay connected under c: its user still exists, is not disallowed and has
// the same password hash; or the auth rule that let it in is still there,
// unchanged, and still the first that matches it.
func (c *Credentials) stillValid(a authn, clientID, remote string) bool {
	switch a.kind {
	case authnUser:
		u, ok := c.users[a.user]
		return ok && !u.disallow && u.hash.Equal(a.hash)
	case authnRule:
		for _, rule := range c.rules {
			if rule.Client.Matches(clientID) && rule.Username.Matches(a.user) && rule.Remote.Matches(remote) &&
				(rule.Password == "" || rule.Password == "*" || rule == a.rule) {
				return rule == a.rule && rule.Allow
			}
		}
		return false
	case authnCert:
		return !c.disallowed(a.user)
	case authnJWT:
		if c.JWT == nil || c.disallowed(a.user) {
			return false
		}
		user, _, _, err := c.JWT.verify(a.token, time.Now())
		return err == nil && user == a.user
	}
	return true
}

// disallowed reports whether user is a ledger user marked disallow.
func (c *Credentials) disallowed(user string) bool {
	u, ok := c.users[user]
	return ok && u.disallow
}
