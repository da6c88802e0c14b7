package main

// The load generator's frames. mqttwire encodes and decodes them; what is
// the load generator's own is how it avoids work on the hot path:
// publishers encode each (topic, key) stream's PUBLISH once, as a template,
// and per message copy it into one write buffer and patch the packet id and
// payload in place (the send time is stamped just before the write);
// subscribers decode frames in place from an mqttwire.Reader and look at a
// PUBLISH's properties only when they check keys.

import "github.com/keyline-mq/keyline/internal/mqttwire"

// keyProperty is the MQTT 5 user property carrying a message's key.
const keyProperty = "key"

// tmpl is one pre-encoded PUBLISH frame: a stream of messages from one
// publisher to one topic (and key), with the packet id and payload patched in.
type tmpl struct {
	frame  []byte
	pidOff int // -1 at QoS 0
	payOff int
	stream uint32 // written to the payload's key field: key index or topic index
	fan    int    // deliveries expected per message (reading subscribers, or 1 for a group)
}

// newTmpl encodes the template of a stream: a PUBLISH to topic at qos with
// a payload of payload bytes, carrying the user property key=key with MQTT 5
// when key is not empty. The payload is zeros, the packet id 0.
func newTmpl(proto byte, topic string, qos byte, key string, payload int) tmpl {
	p := &mqttwire.Publish{Topic: topic, QoS: qos, Payload: make([]byte, payload)}
	if proto == mqttwire.Version5 && key != "" {
		p.Props.User = []mqttwire.UserProperty{{Key: keyProperty, Value: key}}
	}
	t := tmpl{frame: mqttwire.AppendPublish(nil, proto, p), pidOff: -1}
	t.payOff = len(t.frame) - payload
	if qos > 0 {
		h, _ := mqttwire.ParseHeader(t.frame)
		t.pidOff = h.Size + 2 + len(topic) // after the fixed header and the topic
	}
	return t
}
