package hooks

import (
	"fmt"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/keyshared"
)

// DLQPrefix is the topic prefix dead letters are published under:
// $dlq/<share name>/<original topic> (a group's full name holds its filter's
// wildcards, which a topic name may not; the dlq-group property names it).
const DLQPrefix = "$dlq/"

// maxTopicLen is the longest topic name MQTT can carry.
const maxTopicLen = 65535

// dlqPublisher publishes dead letters live through an inline client.
type dlqPublisher struct {
	server *mqtt.Server
	inline *mqtt.Client
	hook   *KeyShared // for its logger
}

// dlqClientID is the inline client that publishes dead letters.
const dlqClientID = "keyline-dlq"

func newDLQPublisher(server *mqtt.Server, h *KeyShared) *dlqPublisher {
	inline := server.NewClient(nil, mqtt.LocalListener, dlqClientID, true)
	inline.Properties.ProtocolVersion = 5
	return &dlqPublisher{server: server, inline: inline, hook: h}
}

// dlqTopic is the live topic of a dead letter of share on topic. A topic
// that would not fit MQTT's 65,535 bytes under the prefix is published on
// $dlq/<share> (the dlq-topic property always names the original).
func dlqTopic(share, topic string) string {
	t := DLQPrefix + share + "/" + strings.TrimPrefix(topic, "/")
	if len(t) > maxTopicLen {
		return DLQPrefix + share
	}
	return t
}

func (p *dlqPublisher) publish(group, share string, d keyshared.DeadLetter) {
	if strings.HasPrefix(share, internalPrefix) {
		return // the broker's own group: its dead letters stay in the admin API
	}
	m := d.Message
	m.QoS = 1
	pk := publishPacket(&m, 1)
	pk.PacketID = 1 // mochi validates it; an inline client's publish tracks no packet id
	pk.TopicName = dlqTopic(share, m.Topic)
	pk.Expiry = 0
	pk.Properties.User = append(pk.Properties.User,
		packets.UserProperty{Key: "dlq-group", Val: group},
		packets.UserProperty{Key: "dlq-key", Val: m.Key},
		packets.UserProperty{Key: "dlq-attempts", Val: fmt.Sprint(d.Attempts)},
		packets.UserProperty{Key: "dlq-reason", Val: fmt.Sprintf("0x%02x", d.Reason)},
		packets.UserProperty{Key: "dlq-offset", Val: fmt.Sprint(m.Offset)},
	)
	if pk.TopicName != DLQPrefix+share+"/"+strings.TrimPrefix(m.Topic, "/") {
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: "dlq-topic", Val: m.Topic})
	}
	if err := p.server.InjectPacket(p.inline, pk); err != nil {
		p.hook.Log.Warn("publish dead letter", "group", group, "topic", clip(pk.TopicName), "error", err)
	}
}
