package ops

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/keyline-mq/keyline/broker/console"
)

// The console's login: a browser cannot send a bearer header when it
// navigates, so the console's login page (package console) checks the token
// once and starts a session, whose cookie adminHandler accepts like the
// bearer header (console.Auth keeps the sessions).

// wantsLogin reports whether an unauthenticated request is a browser opening
// a console page, which is sent to the login page rather than answered 401.
func wantsLogin(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	p := r.URL.Path
	return !strings.HasPrefix(p, "/api/") && !strings.HasPrefix(p, "/debug/")
}

// redirectToLogin sends the browser to the login page, which brings it back.
func redirectToLogin(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, console.LoginPath+"?"+url.Values{"next": {r.URL.RequestURI()}}.Encode(), http.StatusSeeOther)
}
