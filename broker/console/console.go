package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/share"
)

// Backend is what the console needs from the broker. Errors that answer a
// request (no such group, a group that still has members, ...) are
// *adminapi.StatusError with the HTTP status and a message for the operator;
// remote is the requester's address, for the log of an action.
type Backend interface {
	Overview() adminapi.OverviewView
	Groups() ([]adminapi.GroupView, error)
	Group(name string) (adminapi.GroupView, error)
	GroupMessages(ctx context.Context, name string, limit int) (adminapi.GroupMessagesView, error)
	GroupActivity(name string) (adminapi.GroupActivityView, error)
	DeleteGroup(ctx context.Context, name, remote string) (adminapi.DeleteGroupResult, error)
	// DeadLetters is a page of previews (adminapi.DeadLetterView.Truncated);
	// DeadLetter one letter in full.
	DeadLetters(name string, after uint64, limit int) (adminapi.DeadLetterPage, error)
	DeadLetter(name string, id uint64) (adminapi.DeadLetterView, error)
	Replay(ctx context.Context, name string, id uint64, all bool, remote string) (adminapi.ReplayResult, error)
	Purge(name string, id uint64, all bool, remote string) (adminapi.PurgeResult, error)
	Clients() []adminapi.ClientView
	Client(id string) (adminapi.ClientDetail, error)
	Disconnect(id, remote string) (adminapi.DisconnectResult, error)
	Bridges() []adminapi.BridgeView
}

// Options configure a Console.
type Options struct {
	// Auth checks the broker's --http-token and keeps the login sessions
	// (nil: NewAuth(""), the console is open and the login page says so).
	Auth *Auth
	// Logger receives refused logins; nil discards.
	Logger *slog.Logger
}

// Paths served without the token.
const (
	LoginPath    = "/login"
	LogoutPath   = "/logout"
	StaticPrefix = "/static/"
)

// Public reports whether path is served without the token: the login page and
// the static assets (which hold no data).
func Public(path string) bool {
	return path == LoginPath || path == LogoutPath || path == "/favicon.ico" || strings.HasPrefix(path, StaticPrefix)
}

// Page sizes.
const (
	groupsPerPage      = 100
	clientsPerPage     = 100
	deadLettersPerPage = 50
	oldestMessages     = 20
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves the pages. Create it with New.
type Console struct {
	be      Backend
	auth    *Auth
	log     *slog.Logger
	pages   map[string]*template.Template
	version string // of the static assets, for cache-busting URLs
}

// New returns a console over be. It panics if the embedded templates do not
// parse (a build defect, caught by the package tests).
func New(be Backend, opts Options) *Console {
	c := &Console{be: be, auth: opts.Auth, log: opts.Logger, pages: map[string]*template.Template{}}
	if c.auth == nil {
		c.auth = NewAuth("")
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	h := sha256.New()
	_ = fs.WalkDir(staticFS, "static", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := staticFS.ReadFile(path)
			h.Write(b)
		}
		return err
	})
	c.version = hex.EncodeToString(h.Sum(nil))[:12]
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		c.pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n))
	}
	return c
}

// Register adds the console's routes to mux.
func (c *Console) Register(mux *http.ServeMux) {
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix(StaticPrefix, http.FileServerFS(static))
	mux.Handle("GET "+StaticPrefix, c.secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		if r.URL.Query().Get("v") == c.version {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})))
	mux.Handle("GET /favicon.ico", c.secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, StaticPrefix+"favicon.svg?v="+c.version, http.StatusMovedPermanently)
	})))
	page := func(pattern string, h func(w http.ResponseWriter, r *http.Request) (*view, error)) {
		mux.Handle(pattern, c.secure(c.serve(h)))
	}
	page("GET /{$}", c.overview)
	page("GET /groups", c.groups)
	page("GET /groups/view", c.group)
	page("GET /dlq", c.deadLetters)
	page("GET /dlq/letter", c.deadLetter)
	page("GET /clients", c.clients)
	page("GET /clients/view", c.client)
	page("GET /topics", c.topics)
	page("GET /bridges", c.bridges)
	page("GET /confirm", c.confirm)
	page("POST /actions/{action}", c.act)
	page("GET "+LoginPath, c.loginPage)
	page("POST "+LoginPath, c.login)
	page("POST "+LogoutPath, c.logout)
	page("/", func(w http.ResponseWriter, r *http.Request) (*view, error) {
		return nil, &adminapi.StatusError{Status: http.StatusNotFound, Message: "no page " + r.URL.Path}
	})
}

// secure sets the headers every console answer carries.
func (c *Console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// view is a page to render: a template name and what it shows.
type view struct {
	Template string
	Title    string
	Nav      string // the navigation entry to highlight
	Status   int    // 0: 200
	Data     any
}

// layout is what the layout template sees.
type layout struct {
	*view
	Version string
	Auth    bool // a token is set: offer to log out
}

// serve renders what h returns, or an error page.
func (c *Console) serve(h func(w http.ResponseWriter, r *http.Request) (*view, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := h(w, r)
		if err != nil {
			v = c.errorView(err)
		}
		if v == nil {
			return // h answered itself (a redirect)
		}
		var buf bytes.Buffer
		t := c.pages[v.Template]
		if t == nil {
			err = fmt.Errorf("console: no template %q", v.Template)
		} else {
			err = t.ExecuteTemplate(&buf, "layout", layout{view: v, Version: c.version, Auth: !c.auth.Open()})
		}
		if err != nil {
			c.log.Error("rendering a console page", "path", r.URL.Path, "error", err)
			http.Error(w, "console: rendering failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if v.Status != 0 {
			w.WriteHeader(v.Status)
		}
		_, _ = w.Write(buf.Bytes())
	})
}

// errorView is the page for err: its status and message when it is a
// *adminapi.StatusError, else an internal error.
func (c *Console) errorView(err error) *view {
	status, msg := http.StatusInternalServerError, err.Error()
	var se *adminapi.StatusError
	if errors.As(err, &se) {
		status, msg = se.Status, se.Message
	} else {
		c.log.Error("console page", "error", err)
	}
	return &view{Template: "error", Title: http.StatusText(status), Status: status, Data: msg}
}

// badRequest is a 400 answer naming what is wrong.
func badRequest(format string, a ...any) error {
	return &adminapi.StatusError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, a...)}
}

// groupName reads the group= parameter as a canonical group name.
func groupName(r *http.Request) (string, error) {
	v := r.FormValue("group")
	if v == "" {
		return "", badRequest(`missing parameter "group" (a group name "<share>/<filter>")`)
	}
	n, err := share.ParseInput(v)
	if err != nil {
		return "", badRequest("parameter \"group\": %v", err)
	}
	return n.String(), nil
}
