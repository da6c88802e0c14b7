package broker

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// GET /api/v1/clients/{id} (the detail) and POST /api/v1/clients/{id}/disconnect.

// client returns the client with id, leaving out the broker's inline clients.
func (b *Broker) client(id string) (*mqtt.Client, error) {
	cl, ok := b.server.Clients.Get(id)
	if !ok || cl.Net.Inline {
		return nil, notFound(fmt.Sprintf("no client with id %q", id))
	}
	return cl, nil
}

// clientDetail returns a client's view, subscriptions and QoS 1/2 messages.
func (b *Broker) clientDetail(id string) (adminapi.ClientDetail, error) {
	cl, err := b.client(id)
	if err != nil {
		return adminapi.ClientDetail{}, err
	}
	d := adminapi.ClientDetail{
		ClientView: b.viewOf(cl), Username: string(cl.Properties.Username),
		KeepAlive: cl.State.Keepalive, Clean: cl.Properties.Clean,
		SubscriptionList: []adminapi.SubscriptionView{}, InflightMessages: []adminapi.InflightView{},
	}
	for _, s := range cl.State.Subscriptions.GetAll() {
		d.SubscriptionList = append(d.SubscriptionList, adminapi.SubscriptionView{
			Filter: s.Filter, QoS: s.Qos, NoLocal: s.NoLocal, RetainAsPublished: s.RetainAsPublished,
			RetainHandling: s.RetainHandling, Identifier: s.Identifier,
		})
	}
	sort.Slice(d.SubscriptionList, func(i, j int) bool { return d.SubscriptionList[i].Filter < d.SubscriptionList[j].Filter })
	add := func(v adminapi.InflightView) bool {
		if len(d.InflightMessages) == adminapi.MaxClientInflight {
			d.InflightTruncated = true
			return false
		}
		d.InflightMessages = append(d.InflightMessages, v)
		return true
	}
	// What mochi tracks itself (retained messages sent on subscribe,
	// Key-Shared deliveries), sorted as it cannot keep an order...
	var mochis []adminapi.InflightView
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type != packets.Publish {
			continue // a PUBREC/PUBREL step of a QoS 2 flow, or a reserved id
		}
		mochis = append(mochis, adminapi.InflightView{PacketID: pk.PacketID, Topic: pk.TopicName, QoS: pk.FixedHeader.Qos,
			PayloadSize: len(pk.Payload), Created: time.Unix(pk.Created, 0)})
	}
	sort.Slice(mochis, func(i, j int) bool {
		a, b := mochis[i], mochis[j]
		return a.Created.Before(b.Created) || (a.Created.Equal(b.Created) && a.PacketID < b.PacketID)
	})
	for _, v := range mochis {
		if !add(v) {
			return d, nil
		}
	}
	// ...then the session's outbox, in publish order.
	_, _, queued := b.fanout.Outbox(id, adminapi.MaxClientInflight+1)
	for _, m := range queued {
		if !add(adminapi.InflightView{PacketID: m.PacketID, Topic: m.Topic, QoS: m.QoS, PayloadSize: m.Size, Created: time.Unix(m.Created, 0)}) {
			break
		}
	}
	return d, nil
}

func (b *Broker) handleDisconnect(w http.ResponseWriter, r *http.Request) {
	if _, err := queryParams(r); err != nil {
		badRequest(w, err)
		return
	}
	res, err := b.disconnect(r.PathValue("id"), r.RemoteAddr)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// disconnect ends a connected client's connection (MQTT 5 clients get
// DISCONNECT 0x98, administrative action); its persistent session, if any,
// stays. remote names who asked, for the log.
func (b *Broker) disconnect(id, remote string) (adminapi.DisconnectResult, error) {
	cl, err := b.client(id)
	if err != nil {
		return adminapi.DisconnectResult{}, err
	}
	if cl.Closed() {
		return adminapi.DisconnectResult{}, &adminapi.StatusError{Status: http.StatusConflict,
			Message: fmt.Sprintf("client %q is not connected (its persistent session stays until it expires)", id)}
	}
	kept := !cl.Properties.Clean
	if cl.Properties.ProtocolVersion == 5 {
		kept = cl.Properties.Props.SessionExpiryInterval > 0
	}
	// The reason code is what DisconnectClient returns: it says nothing failed.
	_ = b.server.DisconnectClient(cl, packets.ErrAdministrativeAction)
	b.log.Info("disconnected a client through the admin API", "client", id, "session_kept", kept, "remote", remote)
	return adminapi.DisconnectResult{Disconnected: id, SessionKept: kept}, nil
}
