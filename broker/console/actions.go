package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// Actions: GET /confirm?action=... shows what will happen and a form that
// POSTs to /actions/{action}; the answer reports what happened. And the login.

// field is a hidden form field of a confirmation.
type field struct{ Name, Value string }

type confirmData struct {
	Action   string
	Question string
	Details  []string
	Fields   []field
	Back     string
	Button   string
}

type resultData struct {
	Title   string
	Lines   []string
	Error   string
	Replays []adminapi.ReplayedLetter
	Cut     bool // Replays lists only the first ones
	Links   []field
}

// target is what an action acts on, read from the query or the form.
type target struct {
	action string
	group  string // replay, purge, delete-group
	id     uint64 // a dead letter (replay, purge)
	all    bool   // every dead letter (replay, purge)
	client string // disconnect
}

func readTarget(r *http.Request, action string) (target, error) {
	t := target{action: action}
	switch action {
	case "replay", "purge", "delete-group":
		var err error
		if t.group, err = groupName(r); err != nil {
			return t, err
		}
		if action == "delete-group" {
			return t, nil
		}
		t.all = r.FormValue("all") == "1"
		if s := r.FormValue("id"); !t.all {
			if t.id, err = strconv.ParseUint(s, 10, 64); err != nil || t.id == 0 {
				return t, badRequest("parameter \"id\": %q is not a dead letter id (or give all=1)", s)
			}
		}
	case "disconnect":
		if t.client = r.FormValue("client"); t.client == "" {
			return t, badRequest(`missing parameter "client" (a client id)`)
		}
	default:
		return t, badRequest("no action %q (want replay, purge, delete-group or disconnect)", action)
	}
	return t, nil
}

func (t target) fields() []field {
	var fs []field
	if t.group != "" {
		fs = append(fs, field{"group", t.group})
	}
	switch {
	case t.all:
		fs = append(fs, field{"all", "1"})
	case t.id != 0:
		fs = append(fs, field{"id", strconv.FormatUint(t.id, 10)})
	}
	if t.client != "" {
		fs = append(fs, field{"client", t.client})
	}
	return fs
}

func dlqLink(group string) string { return "/dlq?" + url.Values{"group": {group}}.Encode() }

func (c *Console) confirm(_ http.ResponseWriter, r *http.Request) (*view, error) {
	t, err := readTarget(r, r.FormValue("action"))
	if err != nil {
		return nil, err
	}
	d := confirmData{Action: t.action, Fields: t.fields()}
	switch t.action {
	case "replay", "purge":
		verb := map[string]string{"replay": "Replay", "purge": "Purge"}[t.action]
		d.Back, d.Button = dlqLink(t.group), verb
		if t.all {
			page, err := c.be.DeadLetters(t.group, 0, 1)
			if err != nil {
				return nil, err
			}
			d.Question = fmt.Sprintf("%s all %s dead letters of group %s?", verb, num(page.Total), t.group)
			d.Button = verb + " all"
		} else {
			page, err := c.be.DeadLetters(t.group, t.id-1, 1)
			if err != nil {
				return nil, err
			}
			if len(page.DeadLetters) == 0 || page.DeadLetters[0].ID != t.id {
				return nil, &adminapi.StatusError{Status: http.StatusNotFound, Message: fmt.Sprintf("group %q has no dead letter with id %d", t.group, t.id)}
			}
			l := page.DeadLetters[0]
			d.Question = fmt.Sprintf("%s dead letter %d of group %s?", verb, t.id, t.group)
			d.Details = append(d.Details, "key "+l.Key, "topic "+l.Topic, fmt.Sprintf("%s payload, %d attempts, last: %s", byteSize(l.PayloadSize), l.Attempts, l.Reason))
		}
		if t.action == "replay" {
			d.Details = append(d.Details, "Replayed letters go back on the group's log after everything already there and are delivered again, in order per key.")
		} else {
			d.Details = append(d.Details, "Purged letters are deleted for good.")
		}
	case "delete-group":
		g, err := c.be.Group(t.group)
		if err != nil {
			return nil, err
		}
		d.Back, d.Button = "/groups/view?"+url.Values{"group": {t.group}}.Encode(), "Delete group"
		d.Question = fmt.Sprintf("Delete group %s?", t.group)
		d.Details = append(d.Details, fmt.Sprintf("Its backlog (%s messages) and its %s dead letters are deleted with it.", num(g.Backlog), num(g.DeadLetters)))
		if len(g.Members) > 0 {
			d.Details = append(d.Details, fmt.Sprintf("It has %d members now: the broker will refuse until they unsubscribe.", len(g.Members)))
		}
	case "disconnect":
		cl, err := c.be.Client(t.client)
		if err != nil {
			return nil, err
		}
		d.Back, d.Button = "/clients/view?"+url.Values{"id": {t.client}}.Encode(), "Disconnect"
		d.Question = fmt.Sprintf("Disconnect client %s?", t.client)
		d.Details = append(d.Details, fmt.Sprintf("%s, MQTT %s, from %s, %d subscriptions.", cl.Listener, protocol(cl.ProtocolVersion), cl.Remote, cl.Subscriptions),
			"MQTT 5 clients get DISCONNECT 0x98 (administrative action). A persistent session stays; the client may reconnect.")
	}
	return &view{Template: "confirm", Title: "Confirm", Data: d}, nil
}

// act performs a confirmed action and reports what happened.
func (c *Console) act(w http.ResponseWriter, r *http.Request) (*view, error) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		return nil, badRequest("malformed form: %v", err)
	}
	t, err := readTarget(r, r.PathValue("action"))
	if err != nil {
		return nil, err
	}
	remote := r.RemoteAddr
	res, status := resultData{}, 0
	switch t.action {
	case "replay":
		rr, err := c.be.Replay(r.Context(), t.group, t.id, t.all, remote)
		if err != nil && rr.Group == "" {
			return nil, err
		}
		res.Title = "Replay"
		res.Lines = append(res.Lines, fmt.Sprintf("Replayed %s dead letter%s of group %s.", num(rr.Count), plural(rr.Count), t.group))
		res.Error, res.Replays, res.Cut = rr.Error, rr.Replayed, rr.Truncated
		if se := (*adminapi.StatusError)(nil); errors.As(err, &se) {
			status = se.Status // stopped part way: the page says what was done, and why it stopped
		}
		res.Links = []field{{"Dead letters of " + t.group, dlqLink(t.group)}, {"Group " + t.group, "/groups/view?" + url.Values{"group": {t.group}}.Encode()}}
	case "purge":
		pr, err := c.be.Purge(t.group, t.id, t.all, remote)
		if err != nil {
			return nil, err
		}
		res.Title = "Purge"
		res.Lines = append(res.Lines, fmt.Sprintf("Purged %s dead letter%s of group %s.", num(pr.Purged), plural(pr.Purged), t.group))
		res.Links = []field{{"Dead letters of " + t.group, dlqLink(t.group)}}
	case "delete-group":
		dr, err := c.be.DeleteGroup(r.Context(), t.group, remote)
		if err != nil {
			return nil, err
		}
		res.Title = "Delete group"
		res.Lines = append(res.Lines, fmt.Sprintf("Deleted group %s with its backlog of %s messages and %s dead letters.", dr.Deleted, num(dr.Backlog), num(dr.DeadLetters)))
		res.Links = []field{{"Groups", "/groups"}}
	case "disconnect":
		dr, err := c.be.Disconnect(t.client, remote)
		if err != nil {
			return nil, err
		}
		res.Title = "Disconnect"
		line := fmt.Sprintf("Disconnected client %s; it had no persistent session.", dr.Disconnected)
		if dr.SessionKept {
			line = fmt.Sprintf("Disconnected client %s; its persistent session stays.", dr.Disconnected)
		}
		res.Lines = append(res.Lines, line)
		res.Links = []field{{"Clients", "/clients"}}
	}
	return &view{Template: "result", Title: res.Title, Status: status, Data: res}, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

type loginData struct {
	Open  bool // no token is set
	Next  string
	Error string
}

func (c *Console) loginPage(_ http.ResponseWriter, r *http.Request) (*view, error) {
	return &view{Template: "login", Title: "Log in", Data: loginData{Open: c.auth.Open(), Next: safeNext(r.FormValue("next"))}}, nil
}

// login checks the token (through the guess gate, Auth.Check) and starts a
// session.
func (c *Console) login(w http.ResponseWriter, r *http.Request) (*view, error) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		return nil, badRequest("malformed form: %v", err)
	}
	next := safeNext(r.PostForm.Get("next"))
	if c.auth.Open() {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return nil, nil
	}
	ok, err := c.auth.Check(r, r.PostForm.Get("token"))
	if err != nil {
		return nil, nil // the client went away while it waited
	}
	if !ok {
		c.log.Warn("console login refused: wrong token", "remote", r.RemoteAddr)
		return &view{Template: "login", Title: "Log in", Status: http.StatusUnauthorized,
			Data: loginData{Next: next, Error: "That is not the broker's --http-token."}}, nil
	}
	c.auth.startSession(w, r)
	c.log.Info("console login", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
	return nil, nil
}

// logout ends the session on the server (its cookie is worthless from
// then on, wherever it was copied) and clears the cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) (*view, error) {
	c.auth.endSession(w, r)
	http.Redirect(w, r, LoginPath, http.StatusSeeOther)
	return nil, nil
}

// safeNext keeps a post-login destination on this site: a path, not "//host"
// or a URL with a scheme.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.HasPrefix(next, "/\\") || u.Scheme != "" || u.Host != "" || Public(u.Path) {
		return "/"
	}
	return next
}
