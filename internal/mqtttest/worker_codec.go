package mqtttest

// The worker's frames, mapped onto mqttwire: what the worker sends is
// built from its options, what it reads is copied out of the reader's
// buffer into the worker's own types.

import (
	"bytes"
	"fmt"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// AppendVarint appends n as an MQTT variable byte integer (mqttwire's).
func AppendVarint(b []byte, n int) []byte { return mqttwire.AppendVarint(b, n) }

// AppendString appends s as an MQTT UTF-8 string (two-byte length, bytes;
// mqttwire's).
func AppendString(b []byte, s string) []byte { return mqttwire.AppendString(b, s) }

func encodeConnect(clientID string, o WorkerOptions) []byte {
	return mqttwire.AppendConnect(nil, &mqttwire.Connect{
		Version: mqttwire.Version5, ClientID: clientID, CleanStart: o.CleanStart, KeepAlive: o.KeepAlive,
		Username: o.Username, Password: o.Password,
		Props: mqttwire.Properties{SessionExpiry: o.SessionExpiry, ReceiveMaximum: o.ReceiveMaximum, MaximumPacketSize: o.MaximumPacketSize},
	})
}

func encodeSubscribe(id uint16, filter string, qos byte, keyFilters []string) []byte {
	s := &mqttwire.Subscribe{PacketID: id, Filters: []mqttwire.Subscription{{Filter: filter, Options: qos & 0x03}}}
	for _, f := range keyFilters {
		s.Props.User = append(s.Props.User, UserProperty{Key: KeyFilterProperty, Value: f})
	}
	return mqttwire.AppendSubscribe(nil, mqttwire.Version5, s)
}

func encodeUnsubscribe(id uint16, filter string) []byte {
	return mqttwire.AppendUnsubscribe(nil, mqttwire.Version5, &mqttwire.Unsubscribe{PacketID: id, Filters: []string{filter}})
}

func encodePublish(o Outgoing, id uint16) []byte {
	return mqttwire.AppendPublish(nil, mqttwire.Version5, &mqttwire.Publish{
		Topic: o.Topic, QoS: o.QoS, Retain: o.Retain, PacketID: id, Payload: o.Payload,
		Props: mqttwire.Properties{MessageExpiry: o.MessageExpiry, TopicAlias: o.TopicAlias, User: o.User},
	})
}

func decodeConnack(p mqttwire.Packet) (Connack, error) {
	c, err := mqttwire.DecodeConnack(mqttwire.Version5, p)
	if err != nil {
		return Connack{}, err
	}
	props, err := c.Props.Parse()
	if err != nil {
		return Connack{}, err
	}
	ca := Connack{SessionPresent: c.SessionPresent, ReasonCode: c.ReasonCode, MaximumQoS: 2,
		ReceiveMaximum: props.ReceiveMaximum, TopicAliasMax: props.TopicAliasMaximum, ServerKeepAlive: props.ServerKeepAlive,
		AssignedClientID: props.AssignedClientID, ReasonString: props.ReasonString, User: props.User}
	if props.HasMaximumQoS {
		ca.MaximumQoS = props.MaximumQoS
	}
	return ca, nil
}

// decodeMessage decodes a PUBLISH into a message that owns its bytes.
func decodeMessage(p mqttwire.Packet) (*WorkerMessage, error) {
	v, err := mqttwire.DecodePublish(mqttwire.Version5, p)
	if err != nil {
		return nil, err
	}
	props, err := v.Props.Parse()
	if err != nil {
		return nil, err
	}
	if props.TopicAlias != 0 {
		return nil, fmt.Errorf("%w: topic alias %d, but the worker allows none", ErrMalformed, props.TopicAlias)
	}
	m := &WorkerMessage{
		Topic: string(v.Topic), Payload: bytes.Clone(v.Payload), QoS: v.QoS, PacketID: v.PacketID, Dup: v.Dup, Retain: v.Retain,
		User: props.User, MessageExpiry: props.MessageExpiry, HasExpiry: props.HasMessageExpiry,
		ContentType: props.ContentType, ResponseTopic: props.ResponseTopic, CorrelationData: props.CorrelationData,
		PayloadFormat: props.PayloadFormat, SubscriptionIDs: props.SubscriptionIDs,
	}
	m.Key, _ = m.Prop(KeyProperty)
	return m, nil
}

// decodeDisconnect turns the broker's DISCONNECT into Err's value.
func decodeDisconnect(p mqttwire.Packet) error {
	d, err := mqttwire.DecodeDisconnect(mqttwire.Version5, p)
	if err != nil {
		return err
	}
	e := &DisconnectError{ReasonCode: d.ReasonCode}
	if props, err := d.Props.Parse(); err == nil {
		e.Reason = props.ReasonString
	}
	return e
}
