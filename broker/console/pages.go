package console

import (
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The Overview and Groups pages.

type overviewData struct {
	O      adminapi.OverviewView
	Rates  adminapi.OverviewSample // zero until the broker sampled twice
	Charts []chart
}

func (c *Console) overview(_ http.ResponseWriter, _ *http.Request) (*view, error) {
	o := c.be.Overview()
	d := overviewData{O: o}
	if o.Rates != nil {
		d.Rates = *o.Rates
	}
	d.Charts = overviewCharts(o.History)
	return &view{Template: "overview", Title: "Overview", Nav: "overview", Data: d}, nil
}

func overviewCharts(h []adminapi.OverviewSample) []chart {
	vals := map[string][]float64{}
	for _, s := range h {
		vals["messages_in_per_sec"] = append(vals["messages_in_per_sec"], s.MessagesIn)
		vals["messages_out_per_sec"] = append(vals["messages_out_per_sec"], s.MessagesOut)
		vals["dropped_per_sec"] = append(vals["dropped_per_sec"], s.Dropped)
		vals["bytes_in_per_sec"] = append(vals["bytes_in_per_sec"], s.BytesIn)
		vals["bytes_out_per_sec"] = append(vals["bytes_out_per_sec"], s.BytesOut)
		vals["clients_connected"] = append(vals["clients_connected"], float64(s.ClientsConnected))
	}
	return []chart{
		newChart("chart-messages", "Messages per second", "msg/s", "rate", []series{
			{Key: "messages_in_per_sec", Name: "in", Class: "s1"},
			{Key: "messages_out_per_sec", Name: "out", Class: "s2"},
		}, vals),
		newChart("chart-drops", "Drops per second", "msg/s", "rate", []series{
			{Key: "dropped_per_sec", Name: "dropped", Class: "s3"},
		}, vals),
		newChart("chart-bytes", "Bytes per second", "B/s", "bytes", []series{
			{Key: "bytes_in_per_sec", Name: "in", Class: "s1"},
			{Key: "bytes_out_per_sec", Name: "out", Class: "s2"},
		}, vals),
		newChart("chart-clients", "Clients connected", "clients", "int", []series{
			{Key: "clients_connected", Name: "connected", Class: "s4"},
		}, vals),
	}
}

// pager is one page of a long list.
type pager struct {
	Page, Pages     int    // 1-based
	From, To, Total int    // rows From..To (1-based) of Total
	Prev, Next      string // URLs; "" at the ends
}

// paginate returns the page of n rows the request asks for (page=).
func paginate(r *http.Request, n, per int) (pager, int, int, error) {
	p := pager{Page: 1, Total: n, Pages: max(1, (n+per-1)/per)}
	if s := r.FormValue("page"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return p, 0, 0, badRequest("parameter \"page\": %q is not a page number", s)
		}
		p.Page = min(v, p.Pages)
	}
	lo, hi := (p.Page-1)*per, min(p.Page*per, n)
	p.From, p.To = min(lo+1, n), hi
	link := func(page int) string {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(page))
		return r.URL.Path + "?" + q.Encode()
	}
	if p.Page > 1 {
		p.Prev = link(p.Page - 1)
	}
	if p.Page < p.Pages {
		p.Next = link(p.Page + 1)
	}
	return p, lo, hi, nil
}

type groupsData struct {
	Groups []adminapi.GroupView
	Q      string
	Sort   string
	Sorts  []string
	Pager  pager
	All    int // groups in total, before the search
}

var groupSorts = map[string]func(a, b *adminapi.GroupView) bool{
	"name":         func(a, b *adminapi.GroupView) bool { return a.Name < b.Name },
	"backlog":      func(a, b *adminapi.GroupView) bool { return a.Backlog > b.Backlog },
	"dead letters": func(a, b *adminapi.GroupView) bool { return a.DeadLetters > b.DeadLetters },
	"in flight":    func(a, b *adminapi.GroupView) bool { return a.InFlight > b.InFlight },
}

func (c *Console) groups(_ http.ResponseWriter, r *http.Request) (*view, error) {
	all, err := c.be.Groups()
	if err != nil {
		return nil, err
	}
	d := groupsData{Q: strings.TrimSpace(r.FormValue("q")), Sort: r.FormValue("sort"), All: len(all),
		Sorts: []string{"name", "backlog", "dead letters", "in flight"}}
	if d.Sort == "" {
		d.Sort = "name"
	}
	less, ok := groupSorts[d.Sort]
	if !ok {
		return nil, badRequest("parameter \"sort\": %q is not one of %s", d.Sort, strings.Join(d.Sorts, ", "))
	}
	rows := all
	if d.Q != "" {
		rows = nil
		q := strings.ToLower(d.Q)
		for _, g := range all {
			if strings.Contains(strings.ToLower(g.Name), q) {
				rows = append(rows, g)
			}
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return less(&rows[i], &rows[j]) })
	p, lo, hi, err := paginate(r, len(rows), groupsPerPage)
	if err != nil {
		return nil, err
	}
	d.Groups, d.Pager = rows[lo:hi], p
	return &view{Template: "groups", Title: "Groups", Nav: "groups", Data: d}, nil
}

type groupData struct {
	G         adminapi.GroupView
	Messages  adminapi.GroupMessagesView
	Chart     chart
	Deletable bool
	Activity  string // the URL the chart polls
	Detail    string // the URL the figures poll
}

func (c *Console) group(_ http.ResponseWriter, r *http.Request) (*view, error) {
	name, err := groupName(r)
	if err != nil {
		return nil, err
	}
	g, err := c.be.Group(name)
	if err != nil {
		return nil, err
	}
	msgs, err := c.be.GroupMessages(r.Context(), name, oldestMessages)
	if err != nil {
		return nil, err
	}
	act, err := c.be.GroupActivity(name)
	if err != nil {
		return nil, err
	}
	q := url.Values{"group": {name}}.Encode()
	d := groupData{G: g, Messages: msgs, Chart: groupChart(act.History),
		Deletable: len(g.Members) == 0 && len(g.PerMember) == 0,
		Activity:  adminapi.PathGroupActivity + "?" + q, Detail: adminapi.PathGroupDetail + "?" + q}
	return &view{Template: "group", Title: name, Nav: "groups", Data: d}, nil
}

func groupChart(h []adminapi.GroupSample) chart {
	vals := map[string][]float64{}
	for _, s := range h {
		vals["published_per_sec"] = append(vals["published_per_sec"], s.Published)
		vals["delivered_per_sec"] = append(vals["delivered_per_sec"], s.Delivered)
		vals["acked_per_sec"] = append(vals["acked_per_sec"], s.Acked)
		vals["dead_lettered_per_sec"] = append(vals["dead_lettered_per_sec"], s.DeadLettered)
	}
	return newChart("chart-group", "Delivery and acks per second", "msg/s", "rate", []series{
		{Key: "published_per_sec", Name: "published", Class: "s4"},
		{Key: "delivered_per_sec", Name: "delivered", Class: "s1"},
		{Key: "acked_per_sec", Name: "acked", Class: "s2"},
		{Key: "dead_lettered_per_sec", Name: "dead-lettered", Class: "s3"},
	}, vals)
}
