package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// Token guessing. Every check of a token the HTTP listener is given (the
// console's login, the API's bearer header) passes one gate, one check at a
// time; a wrong token holds the gate for GuessSpacing before its answer, so
// at most 1/GuessSpacing wrong guesses a second are answered, from all
// addresses together, however many connections ask. A right token never
// waits for a penalty of its own, only for the checks before it: nobody is
// locked out, not an operator behind the same proxy or on the same host as
// the guesser (the per-address lockout of before did that), only slowed, by
// at most the guesses queued ahead (bounded by the connection caps).
const GuessSpacing = 100 * time.Millisecond

// Sessions: a login gets a random id, kept in memory with its expiry, in an
// HttpOnly cookie; logout ends it on the server, so a copied cookie dies
// with it. At most maxSessions live at once (the oldest goes first).
const (
	SessionTTL  = 12 * time.Hour
	maxSessions = 1024
)

// Auth authenticates requests to the HTTP listener: the token (in a
// bearer header, or given once to the console's login) and the sessions the
// login starts. Create it with NewAuth; its methods are safe for concurrent use.
type Auth struct {
	token []byte
	now   func() time.Time
	gate  chan struct{} // one token check at a time
	// Waiting, when set, is called while a request waits for the gate; it
	// returns the function that ends the wait (the broker lets a waiting
	// connection give way to a new one).
	Waiting func(r *http.Request) func()
	mu      struct {
		sync.Mutex
		sessions map[string]time.Time // id -> expiry
	}
}

// NewAuth returns the authentication for token ("" : none, everything is open).
func NewAuth(token string) *Auth {
	a := &Auth{token: []byte(token), now: time.Now, gate: make(chan struct{}, 1)}
	a.mu.sessions = map[string]time.Time{}
	return a
}

// Open reports whether no token is set.
func (a *Auth) Open() bool { return len(a.token) == 0 }

// Check reports whether token is the broker's, through the gate. It fails
// only when r's context ends while it waits.
func (a *Auth) Check(r *http.Request, token string) (bool, error) {
	if a.Waiting != nil {
		done := a.Waiting(r)
		defer done()
	}
	ctx := r.Context()
	select {
	case a.gate <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-a.gate }()
	if subtle.ConstantTimeCompare([]byte(token), a.token) == 1 {
		return true, nil
	}
	return false, sleep(ctx, GuessSpacing)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Session reports whether r carries the cookie of a live session.
func (a *Auth) Session(r *http.Request) bool {
	c, err := r.Cookie(adminapi.SessionCookie)
	if err != nil || c.Value == "" {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.mu.sessions[c.Value]
	if ok && !a.now().Before(exp) {
		delete(a.mu.sessions, c.Value)
		ok = false
	}
	return ok
}

// startSession creates a session and sets its cookie on w.
func (a *Auth) startSession(w http.ResponseWriter, r *http.Request) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := base64.RawURLEncoding.EncodeToString(b)
	now := a.now()
	exp := now.Add(SessionTTL)
	a.mu.Lock()
	for sid, e := range a.mu.sessions {
		if !now.Before(e) {
			delete(a.mu.sessions, sid)
		}
	}
	for len(a.mu.sessions) >= maxSessions {
		oldest, first := "", time.Time{}
		for sid, e := range a.mu.sessions {
			if oldest == "" || e.Before(first) {
				oldest, first = sid, e
			}
		}
		delete(a.mu.sessions, oldest)
	}
	a.mu.sessions[id] = exp
	a.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: adminapi.SessionCookie, Value: id, Path: "/", Expires: exp, MaxAge: int(SessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// endSession ends r's session, if any, and clears its cookie on w.
func (a *Auth) endSession(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(adminapi.SessionCookie); err == nil {
		a.mu.Lock()
		delete(a.mu.sessions, c.Value)
		a.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: adminapi.SessionCookie, Value: "", Path: "/", MaxAge: -1, Expires: time.Unix(0, 0),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}
