package hooks

import (
	"encoding/binary"
	"encoding/json"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/mochi-mqtt/server/v2/system"

	"github.com/keyline-mq/keyline/persistence"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Storage persists mochi's session state: each persistent session's client
// and subscriptions as its record in a sessionstore.Store (the seam: the
// data file's, persistence.SessionRecords, on one node), and its inflight
// messages with their packet ids and the sysinfo in Keyline's bbolt file;
// retained messages are the Retained hook's (NewBoltRetained on one node).
//
// Only persistent sessions are written (MQTT 5 session expiry > 0, MQTT 3.1.1
// clean session false): a clean session dies with its connection anyway.
// A session record is durable when its hook returns (subscriptions before
// mochi sends the SUBACK); inflight messages are written behind, within one
// commit.
type Storage struct {
	mqtt.HookBase
	server  *mqtt.Server
	store   *persistence.SessionStore
	records sessionstore.Store
	// restored holds the subscriptions StoredClients read with their
	// clients, until StoredSubscriptions hands them to mochi.
	restored []storage.Subscription
	// skipInflight (nil: none) names inflight messages not to store
	// (Key-Shared deliveries, whose durable copy is their group log).
	skipInflight func(client string, packetID uint16) bool
}

// NewStorage returns a storage hook writing session records to records and
// the rest to store. skipInflight (nil: none) names the inflight messages
// it does not store (Key-Shared deliveries, whose durable copy is their
// group log).
func NewStorage(server *mqtt.Server, store *persistence.SessionStore, records sessionstore.Store, skipInflight func(client string, packetID uint16) bool) *Storage {
	return &Storage{server: server, store: store, records: records, skipInflight: skipInflight}
}

// ID returns the hook's id.
func (h *Storage) ID() string { return "keyline-storage" }

// Provides reports which hook methods Storage implements.
func (h *Storage) Provides(b byte) bool { return storageEvents.has(b) }

var storageEvents = eventSet(
	mqtt.OnSessionEstablished,
	mqtt.OnDisconnect,
	mqtt.OnSubscribed,
	mqtt.OnUnsubscribed,
	mqtt.OnWillSent,
	mqtt.OnQosPublish,
	mqtt.OnQosComplete,
	mqtt.OnQosDropped,
	mqtt.OnSysInfoTick,
	mqtt.OnClientExpired,
	mqtt.StoredClients,
	mqtt.StoredSubscriptions,
	mqtt.StoredInflightMessages,
	mqtt.StoredSysInfo,
)

// Stop commits whatever is still queued.
func (h *Storage) Stop() error { return h.store.Sync() }

// persistent reports whether cl's session outlives its connection.
func persistent(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// clientPrefix is the key prefix of everything stored for one client: the id's
// length then the id, so that no client's prefix is a prefix of another's.
func clientPrefix(id string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, len(id)+24), uint64(len(id)))
	return append(b, id...)
}

func subscriptionKey(id, filter string) []byte { return append(clientPrefix(id), filter...) }

// inflightKey is the key of an in-flight entry. Packet ids are per direction
// [MQTT-2.2.1-3]: the client's QoS 2 publishes (the PUBREC sent, awaiting
// PUBREL) get a key of their own, one byte longer, so that the server's
// PUBLISH with the same id is a different record.
func inflightKey(id string, packetID uint16, inbound bool) []byte {
	k := binary.BigEndian.AppendUint16(clientPrefix(id), packetID)
	if inbound {
		k = append(k, 'i')
	}
	return k
}

func (h *Storage) put(kind string, key []byte, v storage.Serializable) {
	data, err := v.MarshalBinary()
	if err != nil {
		h.Log.Error("storage: encode record", "kind", kind, "error", err)
		return
	}
	h.store.Put(kind, key, data)
}

// OnDisconnect forgets a session that ends with its connection.
func (h *Storage) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire && cl.StopCause() != packets.ErrSessionTakenOver {
		h.forget(cl.ID)
	}
}

// OnClientExpired forgets a session whose expiry interval has passed.
func (h *Storage) OnClientExpired(cl *mqtt.Client) { h.forget(cl.ID) }

func storedMessage(pk packets.Packet) *storage.Message {
	props := pk.Properties.Copy(false)
	return &storage.Message{
		FixedHeader: pk.FixedHeader,
		TopicName:   pk.TopicName,
		Payload:     pk.Payload,
		Created:     pk.Created,
		Origin:      pk.Origin,
		PacketID:    pk.PacketID,
		Properties: storage.MessageProperties{
			PayloadFormat:          props.PayloadFormat,
			PayloadFormatFlag:      props.PayloadFormatFlag,
			MessageExpiryInterval:  props.MessageExpiryInterval,
			ContentType:            props.ContentType,
			ResponseTopic:          props.ResponseTopic,
			CorrelationData:        props.CorrelationData,
			SubscriptionIdentifier: props.SubscriptionIdentifier,
			User:                   props.User,
		},
	}
}

// OnQosPublish stores an inflight message of a persistent session, packet id included.
func (h *Storage) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, _ int) {
	// mochi records its own PUBACK to a QoS 1 publisher and completes it at
	// once; nothing about it needs to survive a restart.
	if !persistent(cl) || pk.FixedHeader.Type == packets.Puback ||
		(h.skipInflight != nil && h.skipInflight(cl.ID, pk.PacketID)) {
		return
	}
	m := storedMessage(pk)
	m.T, m.Client, m.Sent = storage.InflightKey, cl.ID, sent
	h.put(persistence.KindInflight, inflightKey(cl.ID, pk.PacketID, mqtt.IsInbound(pk)), m)
}

// OnQosComplete deletes a resolved inflight message. It is told with the
// packet that completed the flow: the client's PUBREL completes the client's
// publish, a PUBACK or PUBCOMP one of the server's.
func (h *Storage) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if persistent(cl) {
		h.store.Delete(persistence.KindInflight, inflightKey(cl.ID, pk.PacketID, pk.FixedHeader.Type == packets.Pubrel))
	}
}

// OnQosDropped deletes a dropped inflight message; mochi (the fork) hands it
// the in-flight entry dropped, whose type says its direction.
func (h *Storage) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if persistent(cl) {
		h.store.Delete(persistence.KindInflight, inflightKey(cl.ID, pk.PacketID, mqtt.IsInbound(pk)))
	}
}

// OnSysInfoTick stores the latest system info.
func (h *Storage) OnSysInfoTick(sys *system.Info) {
	h.put(persistence.KindSysInfo, []byte(storage.SysInfoKey), &storage.SystemInfo{ID: storage.SysInfoKey, T: storage.SysInfoKey, Info: *sys})
}

func loadAll[T any](h *Storage, kind string) ([]T, error) {
	var out []T
	err := h.store.ForEach(kind, func(_, val []byte) error {
		var v T
		if err := json.Unmarshal(val, &v); err != nil {
			// One unreadable record must not cost every other session.
			h.Log.Error("storage: skipping unreadable record", "kind", kind, "error", err)
			return nil
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// StoredInflightMessages returns the stored inflight messages.
func (h *Storage) StoredInflightMessages() ([]storage.Message, error) {
	return loadAll[storage.Message](h, persistence.KindInflight)
}

// StoredSysInfo returns the stored system info.
func (h *Storage) StoredSysInfo() (storage.SystemInfo, error) {
	all, err := loadAll[storage.SystemInfo](h, persistence.KindSysInfo)
	if err != nil || len(all) == 0 {
		return storage.SystemInfo{}, err
	}
	return all[0], nil
}
