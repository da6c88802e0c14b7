package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The Clients and Topics pages.

// slowState names a client's state as a slow consumer, and its CSS class.
func slowState(v adminapi.ClientView) (string, string) {
	switch {
	case !v.Connected:
		return "session only", "muted"
	case v.QueueSoft > 0 && v.QueuedBytes > v.QueueSoft:
		return "slow: queue over its soft limit", "bad"
	case v.DroppedMessages > 0:
		return "has dropped messages", "warn"
	}
	return "ok", "ok"
}

type clientRow struct {
	adminapi.ClientView
	State, StateClass string
}

type clientsData struct {
	Clients []clientRow
	Q       string
	Slow    bool // only clients that are slow or dropped messages
	Pager   pager
	All     int
	Cluster bool // cluster mode: the node column is shown
}

func (c *Console) clients(_ http.ResponseWriter, r *http.Request) (*view, error) {
	all := c.be.Clients()
	d := clientsData{Q: strings.TrimSpace(r.FormValue("q")), Slow: r.FormValue("slow") != "", All: len(all)}
	q := strings.ToLower(d.Q)
	var rows []clientRow
	for _, v := range all {
		d.Cluster = d.Cluster || v.Node != ""
		if q != "" && !strings.Contains(strings.ToLower(v.ID), q) && !strings.Contains(strings.ToLower(v.Remote), q) &&
			!strings.Contains(strings.ToLower(v.Listener), q) {
			continue
		}
		row := clientRow{ClientView: v}
		row.State, row.StateClass = slowState(v)
		if d.Slow && row.StateClass != "bad" && row.StateClass != "warn" {
			continue
		}
		rows = append(rows, row)
	}
	p, lo, hi, err := paginate(r, len(rows), clientsPerPage)
	if err != nil {
		return nil, err
	}
	d.Clients, d.Pager = rows[lo:hi], p
	return &view{Template: "clients", Title: "Clients", Nav: "clients", Data: d}, nil
}

type clientData struct {
	C                 adminapi.ClientDetail
	State, StateClass string
	Poll              string
}

func (c *Console) client(_ http.ResponseWriter, r *http.Request) (*view, error) {
	id := r.FormValue("id")
	if id == "" {
		return nil, badRequest(`missing parameter "id" (a client id)`)
	}
	d, err := c.be.Client(id)
	if err != nil {
		return nil, err
	}
	cd := clientData{C: d, Poll: adminapi.PathClients + "/" + url.PathEscape(id)}
	cd.State, cd.StateClass = slowState(d.ClientView)
	return &view{Template: "client", Title: "Client " + id, Nav: "clients", Data: cd}, nil
}

type topicsData struct {
	Filter string
	Stream string // the stream's URL
}

func (c *Console) topics(_ http.ResponseWriter, r *http.Request) (*view, error) {
	d := topicsData{Filter: r.FormValue("filter")}
	if d.Filter != "" {
		d.Stream = adminapi.PathTopicStream + "?" + url.Values{"filter": {d.Filter}}.Encode()
	}
	return &view{Template: "topics", Title: "Topics", Nav: "topics", Data: d}, nil
}
