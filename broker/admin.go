package broker

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/keyline-mq/keyline/internal/connq"
)

// ClientView is what the admin API shows of one client.
type ClientView struct {
	ID              string `json:"id"`
	Listener        string `json:"listener"`
	Remote          string `json:"remote"`
	ProtocolVersion byte   `json:"protocol_version"`
	Connected       bool   `json:"connected"`
	Subscriptions   int    `json:"subscriptions"`
	Inflight        int    `json:"inflight"`
	// Outbound queue (absent for a disconnected persistent session).
	QueuedBytes     int    `json:"queued_bytes"`
	DroppedMessages uint64 `json:"dropped_messages"`
	DroppedBytes    uint64 `json:"dropped_bytes"`
	SlowPolicy      string `json:"slow_policy,omitempty"`
	QueueSoft       int    `json:"conn_queue_soft,omitempty"`
	QueueHard       int    `json:"conn_queue_hard,omitempty"`
}

// ClientViews lists the clients the broker knows, connected or holding a
// persistent session, sorted by id.
func (b *Broker) ClientViews() []ClientView {
	if b.server == nil {
		return nil
	}
	var out []ClientView
	for _, cl := range b.server.Clients.GetAll() {
		if cl.Net.Inline {
			continue
		}
		v := ClientView{
			ID: cl.ID, Listener: cl.Net.Listener, Remote: cl.Net.Remote,
			ProtocolVersion: cl.Properties.ProtocolVersion, Connected: !cl.Closed(),
			Subscriptions: cl.State.Subscriptions.Len(), Inflight: cl.State.Inflight.Len(),
		}
		if q, ok := cl.Net.Conn.(*connq.Conn); ok {
			v.QueuedBytes = q.Queued()
			v.DroppedMessages, v.DroppedBytes = q.Dropped()
			l := q.Limits()
			v.SlowPolicy, v.QueueSoft, v.QueueHard = l.Policy.String(), l.Soft, l.Hard
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

type apiError struct {
	Error string `json:"error"`
}

func (b *Broker) handleClients(w http.ResponseWriter, _ *http.Request) {
	views := b.ClientViews()
	if views == nil {
		views = []ClientView{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"clients": views})
}

func (b *Broker) handleClient(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, v := range b.ClientViews() {
		if v.ID == id {
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeJSON(w, http.StatusNotFound, apiError{Error: "no client with id " + id})
}
