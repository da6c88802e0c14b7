package console

import (
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The Dead letters pages: the groups that hold some, one group's letters
// (paged by id), and one letter.

type deadLettersData struct {
	Group  string // "" for the list of groups
	Groups []adminapi.GroupView
	Pager  pager
	Page   adminapi.DeadLetterPage
	After  uint64
	Next   string // URL of the next page
	First  string // URL of the first page
}

func (c *Console) deadLetters(_ http.ResponseWriter, r *http.Request) (*view, error) {
	if r.FormValue("group") == "" {
		return c.deadLetterGroups(r)
	}
	name, err := groupName(r)
	if err != nil {
		return nil, err
	}
	d := deadLettersData{Group: name}
	if s := r.FormValue("after"); s != "" {
		if d.After, err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, badRequest("parameter \"after\": %q is not a dead letter id", s)
		}
	}
	if d.Page, err = c.be.DeadLetters(name, d.After, deadLettersPerPage); err != nil {
		return nil, err
	}
	link := func(after uint64) string {
		q := url.Values{"group": {name}}
		if after > 0 {
			q.Set("after", strconv.FormatUint(after, 10))
		}
		return "/dlq?" + q.Encode()
	}
	if d.Page.More {
		d.Next = link(d.Page.NextAfter)
	}
	if d.After > 0 {
		d.First = link(0)
	}
	return &view{Template: "dlq", Title: "Dead letters of " + name, Nav: "dlq", Data: d}, nil
}

// deadLetterGroups lists the groups that hold dead letters, most first.
func (c *Console) deadLetterGroups(r *http.Request) (*view, error) {
	all, err := c.be.Groups()
	if err != nil {
		return nil, err
	}
	var rows []adminapi.GroupView
	for _, g := range all {
		if g.DeadLetters > 0 {
			rows = append(rows, g)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].DeadLetters > rows[j].DeadLetters })
	p, lo, hi, err := paginate(r, len(rows), groupsPerPage)
	if err != nil {
		return nil, err
	}
	return &view{Template: "dlq", Title: "Dead letters", Nav: "dlq", Data: deadLettersData{Groups: rows[lo:hi], Pager: p}}, nil
}

type deadLetterData struct {
	Group string
	L     adminapi.DeadLetterView
}

func (c *Console) deadLetter(_ http.ResponseWriter, r *http.Request) (*view, error) {
	name, err := groupName(r)
	if err != nil {
		return nil, err
	}
	id, err := strconv.ParseUint(r.FormValue("id"), 10, 64)
	if err != nil || id == 0 {
		return nil, badRequest("parameter \"id\": %q is not a dead letter id", r.FormValue("id"))
	}
	l, err := c.be.DeadLetter(name, id)
	var se *adminapi.StatusError
	if errors.As(err, &se) && se.Status == http.StatusNotFound {
		return nil, &adminapi.StatusError{Status: http.StatusNotFound, Message: se.Message + " (replayed or purged?)"}
	}
	if err != nil {
		return nil, err
	}
	return &view{Template: "letter", Title: "Dead letter " + strconv.FormatUint(id, 10), Nav: "dlq",
		Data: deadLetterData{Group: name, L: l}}, nil
}
