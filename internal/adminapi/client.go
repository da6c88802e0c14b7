package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Route is one call of the API whose answer decodes into T.
type Route[T any] struct {
	Method string
	Path   string
	Query  url.Values
}

// ListGroups lists every group.
func ListGroups() Route[GroupList] { return Route[GroupList]{http.MethodGet, PathGroups, nil} }

// GroupDetail shows one group with its settings and members.
func GroupDetail(group string) Route[GroupView] {
	return Route[GroupView]{http.MethodGet, PathGroupDetail, url.Values{"group": {group}}}
}

// DeleteGroup deletes a group without members, with its backlog and dead letters.
func DeleteGroup(group string) Route[DeleteGroupResult] {
	return Route[DeleteGroupResult]{http.MethodDelete, PathGroups, url.Values{"group": {group}}}
}

// DeadLetters lists up to limit dead letters of group with ids after after.
func DeadLetters(group string, after uint64, limit int) Route[DeadLetterPage] {
	return Route[DeadLetterPage]{http.MethodGet, PathDLQ, url.Values{
		"group": {group}, "after": {strconv.FormatUint(after, 10)}, "limit": {strconv.Itoa(limit)}}}
}

// DeadLetter returns dead letter id of group in full.
func DeadLetter(group string, id uint64) Route[DeadLetterView] {
	return Route[DeadLetterView]{http.MethodGet, PathDLQLetter, url.Values{"group": {group}, "id": {strconv.FormatUint(id, 10)}}}
}

// Replay puts dead letter id of group back on its log; all of them when all is set.
func Replay(group string, id uint64, all bool) Route[ReplayResult] {
	return Route[ReplayResult]{http.MethodPost, PathDLQReplay, dlqQuery(group, id, all)}
}

// Purge deletes dead letter id of group; all of them when all is set.
func Purge(group string, id uint64, all bool) Route[PurgeResult] {
	return Route[PurgeResult]{http.MethodPost, PathDLQPurge, dlqQuery(group, id, all)}
}

func dlqQuery(group string, id uint64, all bool) url.Values {
	q := url.Values{"group": {group}}
	if !all {
		q.Set("id", strconv.FormatUint(id, 10))
	}
	return q
}

// ListClients lists the clients the broker knows.
func ListClients() Route[ClientList] { return Route[ClientList]{http.MethodGet, PathClients, nil} }

// Client shows one client.
func Client(id string) Route[ClientView] {
	return Route[ClientView]{http.MethodGet, PathClients + "/" + url.PathEscape(id), nil}
}

// Conn calls one broker's admin API.
type Conn struct {
	base  *url.URL
	token string
	http  *http.Client
}

// Dial returns a Conn to the broker whose --http address is server ("host:port"
// or an http(s) URL). It sends nothing yet.
func Dial(server, token string) (*Conn, error) {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	u, err := url.Parse(strings.TrimRight(server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL like http://127.0.0.1:9883", server)
	}
	// Replaying or purging a large dead-letter queue takes a while.
	return &Conn{base: u, token: token, http: &http.Client{Timeout: 10 * time.Minute}}, nil
}

// Server returns the URL the Conn calls.
func (c *Conn) Server() string { return c.base.String() }

// StatusError is an answer other than 2xx: the server's message and status.
type StatusError struct {
	Status  int
	Message string
	// NoToken reports a 401 to a Conn that has no token.
	NoToken bool
}

func (e *StatusError) Error() string {
	if e.NoToken {
		return fmt.Sprintf("the admin API needs a token (HTTP %d)", e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// ErrUnreachable wraps failures to reach the broker or read its answer.
var ErrUnreachable = errors.New("cannot reach the broker")

// Call sends r and decodes the answer. It returns the answer's raw JSON too
// (what `--json` prints). A non-2xx answer is a *StatusError.
func Call[T any](ctx context.Context, c *Conn, r Route[T]) (T, []byte, error) {
	var out T
	resp, err := c.send(ctx, c.http, r.Method, r.Path, r.Query)
	if err != nil {
		return out, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return out, nil, fmt.Errorf("%w: %s %s: reading the answer: %v", ErrUnreachable, r.Method, r.Path, err)
	}
	if resp.StatusCode/100 != 2 {
		return out, body, c.statusError(resp.StatusCode, body)
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&out); err != nil {
		return out, body, fmt.Errorf("%s %s: the answer is not the JSON expected (is %s a keyline broker?): %v", r.Method, r.Path, c.base, err)
	}
	return out, body, nil
}

// Stream sends a request whose answer is a stream rather than JSON (a
// backup) and returns its body, unread; the caller closes it. Unlike Call
// it sets no overall time limit (ctx bounds it). A non-2xx answer is a
// *StatusError.
func (c *Conn) Stream(ctx context.Context, method, path string, query url.Values) (io.ReadCloser, error) {
	resp, err := c.send(ctx, &http.Client{}, method, path, query)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, c.statusError(resp.StatusCode, body)
	}
	return resp.Body, nil
}

func (c *Conn) send(ctx context.Context, hc *http.Client, method, path string, query url.Values) (*http.Response, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, c.base, err)
	}
	return resp, nil
}

// statusError turns a non-2xx answer into a *StatusError carrying the
// server's message.
func (c *Conn) statusError(status int, body []byte) error {
	var e Error
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(body))
		if !utf8.Valid(body) || len(e.Error) > 200 || e.Error == "" {
			e.Error = "unexpected answer"
		}
	}
	return &StatusError{Status: status, Message: e.Error, NoToken: status == http.StatusUnauthorized && c.token == ""}
}
