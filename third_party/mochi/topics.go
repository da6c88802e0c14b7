// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: 2023 mochi-mqtt, mochi-co
// SPDX-FileContributor: mochi-co

package mqtt

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
)

var (
	SharePrefix = "$SHARE" // the prefix indicating a share topic
	SysPrefix   = "$SYS"   // the prefix indicating a system info topic
)

// TopicAliases contains inbound and outbound topic alias registrations.
type TopicAliases struct {
	Inbound  *InboundTopicAliases
	Outbound *OutboundTopicAliases
}

// NewTopicAliases returns an instance of TopicAliases.
func NewTopicAliases(topicAliasMaximum uint16) TopicAliases {
	return TopicAliases{
		Inbound:  NewInboundTopicAliases(topicAliasMaximum),
		Outbound: NewOutboundTopicAliases(topicAliasMaximum),
	}
}

// NewInboundTopicAliases returns a pointer to InboundTopicAliases.
func NewInboundTopicAliases(topicAliasMaximum uint16) *InboundTopicAliases {
	return &InboundTopicAliases{maximum: topicAliasMaximum} // the map is made by the first Set (Keyline's fork)
}

var (
	// ErrTopicAliasUnknown refuses a PUBLISH with no topic and an alias the
	// connection has not given a topic.
	ErrTopicAliasUnknown = packets.Code{Code: packets.ErrProtocolViolation.Code, Reason: "protocol violation: unknown topic alias"}
	// ErrTopicAliasBytes refuses a PUBLISH whose topic would take the
	// connection's aliases past Capabilities.TopicAliasBytes.
	ErrTopicAliasBytes = packets.Code{Code: packets.ErrQuotaExceeded.Code, Reason: "quota exceeded: topic aliases hold too many bytes"}
)

// InboundTopicAliases contains a map of topic aliases received from the client.
type InboundTopicAliases struct {
	internal map[uint16]string
	sync.RWMutex
	maximum uint16
	bytes   int // bytes of the topics in internal
}

// Set sets a new alias for a specific topic.
func (a *InboundTopicAliases) Set(id uint16, topic string) string {
	topic, _ = a.Resolve(id, topic, 0)
	return topic
}

// Resolve applies the Topic Alias id of a PUBLISH whose topic is topic: an
// empty topic takes the one recorded for id, any other is recorded for id
// (a copy: topic is a view into the packet, payload included, which the
// table would otherwise keep alive). It refuses an empty topic for an alias
// it has no topic for (a protocol error, [MQTT-3.3.2-12] ~[MQTT-3.3.4]) and
// a topic that would take the table past maxBytes bytes of topics (0: no
// limit), so a connection's aliases hold at most maxBytes.
func (a *InboundTopicAliases) Resolve(id uint16, topic string, maxBytes int) (string, packets.Code) {
	if a == nil {
		return topic, packets.CodeSuccess // no table: as a maximum of 0 (Keyline's fork: made only for clients that may use aliases)
	}
	a.Lock()
	defer a.Unlock()

	if a.maximum == 0 {
		return topic, packets.CodeSuccess // ?
	}

	existing, ok := a.internal[id]
	if topic == "" {
		if !ok {
			return "", ErrTopicAliasUnknown
		}
		return existing, packets.CodeSuccess
	}

	if ok && existing == topic {
		return existing, packets.CodeSuccess
	}

	if maxBytes > 0 && a.bytes-len(existing)+len(topic) > maxBytes {
		return topic, ErrTopicAliasBytes
	}

	topic = strings.Clone(topic)
	a.bytes += len(topic) - len(existing)
	if a.internal == nil {
		a.internal = map[uint16]string{}
	}
	a.internal[id] = topic
	return topic, packets.CodeSuccess
}

// Reset forgets every alias: topic aliases last as long as the network
// connection [MQTT-3.3.2-7], while the client (an offline session) may stay.
func (a *InboundTopicAliases) Reset() {
	a.Lock()
	defer a.Unlock()
	a.internal = nil // made again by the next Set
	a.bytes = 0
}

// OutboundTopicAliases contains a map of topic aliases sent from the broker to the client.
type OutboundTopicAliases struct {
	internal map[string]uint16
	sync.RWMutex
	cursor  uint32
	maximum uint16
}

// NewOutboundTopicAliases returns a pointer to OutboundTopicAliases.
func NewOutboundTopicAliases(topicAliasMaximum uint16) *OutboundTopicAliases {
	return &OutboundTopicAliases{maximum: topicAliasMaximum} // the map is made by the first Set (Keyline's fork)
}

// Set sets a new topic alias for a topic and returns the alias value, and a boolean
// indicating if the alias already existed.
func (a *OutboundTopicAliases) Set(topic string) (uint16, bool) {
	if a == nil {
		return 0, false // no table: as a maximum of 0 (Keyline's fork)
	}
	a.Lock()
	defer a.Unlock()

	if a.maximum == 0 {
		return 0, false
	}

	if i, ok := a.internal[topic]; ok {
		return i, true
	}

	i := atomic.LoadUint32(&a.cursor)
	if i+1 > uint32(a.maximum) {
		// if i+1 > math.MaxUint16 {
		return 0, false
	}

	if a.internal == nil {
		a.internal = map[string]uint16{}
	}
	a.internal[topic] = uint16(i) + 1
	atomic.StoreUint32(&a.cursor, i+1)
	return uint16(i) + 1, false
}

// SharedSubscriptions contains a map of subscriptions to a shared filter,
// keyed on share group then client id.
type SharedSubscriptions struct {
	internal map[string]map[string]packets.Subscription
	sync.RWMutex
}

// NewSharedSubscriptions returns a new instance of Subscriptions. Its map is
// made by the first Add (Keyline's fork: most index nodes have none). Keyline's
// fork: a nil *SharedSubscriptions reads as empty (a topic index node makes
// its set with its first shared subscription, PATCHES.md item 27).
func NewSharedSubscriptions() *SharedSubscriptions {
	return &SharedSubscriptions{}
}

// Add creates a new shared subscription for a group and client id pair.
func (s *SharedSubscriptions) Add(group, id string, val packets.Subscription) {
	s.Lock()
	defer s.Unlock()
	if s.internal == nil {
		s.internal = map[string]map[string]packets.Subscription{}
	}
	if _, ok := s.internal[group]; !ok {
		s.internal[group] = map[string]packets.Subscription{}
	}
	s.internal[group][id] = val
}

// Delete deletes a client id from a shared subscription group.
func (s *SharedSubscriptions) Delete(group, id string) {
	if s == nil {
		return
	}
	s.Lock()
	defer s.Unlock()
	delete(s.internal[group], id)
	if len(s.internal[group]) == 0 {
		delete(s.internal, group)
	}
}

// Get returns the subscription properties for a client id in a share group, if one exists.
func (s *SharedSubscriptions) Get(group, id string) (val packets.Subscription, ok bool) {
	if s == nil {
		return val, false
	}
	s.RLock()
	defer s.RUnlock()
	if _, ok := s.internal[group]; !ok {
		return val, ok
	}

	val, ok = s.internal[group][id]
	return val, ok
}

// GroupLen returns the number of groups subscribed to the filter.
func (s *SharedSubscriptions) GroupLen() int {
	if s == nil {
		return 0
	}
	s.RLock()
	defer s.RUnlock()
	val := len(s.internal)
	return val
}

// Len returns the total number of shared subscriptions to a filter across all groups.
func (s *SharedSubscriptions) Len() int {
	if s == nil {
		return 0
	}
	s.RLock()
	defer s.RUnlock()
	n := 0
	for _, group := range s.internal {
		n += len(group)
	}
	return n
}

// GetAll returns all shared subscription groups and their subscriptions.
// each calls f for every shared subscription, under the read lock.
func (s *SharedSubscriptions) each(f func(group, id string, sub packets.Subscription)) {
	if s == nil {
		return
	}
	s.RLock()
	defer s.RUnlock()
	for group, subs := range s.internal {
		for id, sub := range subs {
			f(group, id, sub)
		}
	}
}

func (s *SharedSubscriptions) GetAll() map[string]map[string]packets.Subscription {
	m := map[string]map[string]packets.Subscription{}
	if s == nil {
		return m
	}
	s.RLock()
	defer s.RUnlock()
	for group, subs := range s.internal {
		if _, ok := m[group]; !ok {
			m[group] = map[string]packets.Subscription{}
		}

		for id, sub := range subs {
			m[group][id] = sub
		}
	}
	return m
}

// InlineSubFn is the signature for a callback function which will be called
// when an inline client receives a message on a topic it is subscribed to.
// The sub argument contains information about the subscription that was matched for any filters.
type InlineSubFn func(cl *Client, sub packets.Subscription, pk packets.Packet)

// InlineSubscriptions represents a map of internal subscriptions keyed on client.
type InlineSubscriptions struct {
	internal map[int]InlineSubscription
	sync.RWMutex
}

// NewInlineSubscriptions returns a new instance of InlineSubscriptions. Its
// map is made by the first Add (Keyline's fork: most index nodes have none).
// Keyline's fork: a nil *InlineSubscriptions reads as empty (PATCHES.md item 27).
func NewInlineSubscriptions() *InlineSubscriptions {
	return &InlineSubscriptions{}
}

// Add adds a new internal subscription for a client id.
func (s *InlineSubscriptions) Add(val InlineSubscription) {
	s.Lock()
	defer s.Unlock()
	if s.internal == nil {
		s.internal = map[int]InlineSubscription{}
	}
	s.internal[val.Identifier] = val
}

// GetAll returns all internal subscriptions.
// each calls f for every inline subscription, under the read lock.
func (s *InlineSubscriptions) each(f func(id int, sub InlineSubscription)) {
	if s == nil {
		return
	}
	s.RLock()
	defer s.RUnlock()
	for k, v := range s.internal {
		f(k, v)
	}
}

func (s *InlineSubscriptions) GetAll() map[int]InlineSubscription {
	m := map[int]InlineSubscription{}
	if s == nil {
		return m
	}
	s.RLock()
	defer s.RUnlock()
	for k, v := range s.internal {
		m[k] = v
	}
	return m
}

// Get returns an internal subscription for a client id.
func (s *InlineSubscriptions) Get(id int) (val InlineSubscription, ok bool) {
	if s == nil {
		return val, false
	}
	s.RLock()
	defer s.RUnlock()
	val, ok = s.internal[id]
	return val, ok
}

// Len returns the number of internal subscriptions.
func (s *InlineSubscriptions) Len() int {
	if s == nil {
		return 0
	}
	s.RLock()
	defer s.RUnlock()
	val := len(s.internal)
	return val
}

// Delete removes an internal subscription by the client id.
func (s *InlineSubscriptions) Delete(id int) {
	if s == nil {
		return
	}
	s.Lock()
	defer s.Unlock()
	delete(s.internal, id)
}

// Subscriptions is a map of subscriptions keyed on client.
//
// Keyline's fork: up to smallSubscriptions entries are kept in a small
// slice, a map only beyond (a Go map with one entry of this size takes
// some 700 bytes; a client with one subscription, and the topic index node
// it subscribes to, had one each). See PATCHES.md.
type Subscriptions struct {
	internal map[string]packets.Subscription // nil while small holds every entry
	small    []subscriptionEntry             // the entries while there are at most smallSubscriptions
	sync.RWMutex
}

type subscriptionEntry struct {
	id  string
	sub packets.Subscription
}

// smallSubscriptions is how many entries Subscriptions keeps without a map.
const smallSubscriptions = 4

// NewSubscriptions returns a new instance of Subscriptions.
func NewSubscriptions() *Subscriptions {
	return &Subscriptions{}
}

// Add adds a new subscription for a client. ID can be a filter in the
// case this map is client state, or a client id if particle state.
func (s *Subscriptions) Add(id string, val packets.Subscription) {
	s.Lock()
	defer s.Unlock()
	if s.internal != nil {
		s.internal[id] = val
		return
	}
	for i := range s.small {
		if s.small[i].id == id {
			s.small[i].sub = val
			return
		}
	}
	if len(s.small) < smallSubscriptions {
		if len(s.small) == cap(s.small) { // grow by one: most hold one entry for good
			s.small = append(make([]subscriptionEntry, 0, len(s.small)+1), s.small...)
		}
		s.small = append(s.small, subscriptionEntry{id: id, sub: val})
		return
	}
	s.internal = make(map[string]packets.Subscription, len(s.small)+1)
	for _, e := range s.small {
		s.internal[e.id] = e.sub
	}
	s.internal[id] = val
	s.small = nil
}

// each calls f for every subscription, under the read lock (Keyline's
// fork: the topic walk reads the entries without a copy of them).
func (s *Subscriptions) each(f func(id string, sub packets.Subscription)) {
	s.RLock()
	defer s.RUnlock()
	for k, v := range s.internal {
		f(k, v)
	}
	for _, e := range s.small {
		f(e.id, e.sub)
	}
}

// GetAll returns all subscriptions.
func (s *Subscriptions) GetAll() map[string]packets.Subscription {
	s.RLock()
	defer s.RUnlock()
	m := make(map[string]packets.Subscription, len(s.internal)+len(s.small))
	for k, v := range s.internal {
		m[k] = v
	}
	for _, e := range s.small {
		m[e.id] = e.sub
	}
	return m
}

// Get returns a subscriptions for a specific client or filter id.
func (s *Subscriptions) Get(id string) (val packets.Subscription, ok bool) {
	s.RLock()
	defer s.RUnlock()
	if s.internal != nil {
		val, ok = s.internal[id]
		return val, ok
	}
	for _, e := range s.small {
		if e.id == id {
			return e.sub, true
		}
	}
	return val, false
}

// Len returns the number of subscriptions.
func (s *Subscriptions) Len() int {
	s.RLock()
	defer s.RUnlock()
	return len(s.internal) + len(s.small)
}

// Delete removes a subscription by client or filter id.
func (s *Subscriptions) Delete(id string) {
	s.Lock()
	defer s.Unlock()
	if s.internal != nil {
		delete(s.internal, id)
		return
	}
	for i := range s.small {
		if s.small[i].id == id {
			last := len(s.small) - 1
			s.small[i] = s.small[last]
			s.small[last] = subscriptionEntry{}
			s.small = s.small[:last]
			if last == 0 {
				s.small = nil
			}
			return
		}
	}
}

// ClientSubscriptions is a map of aggregated subscriptions for a client.
type ClientSubscriptions map[string]packets.Subscription

type InlineSubscription struct {
	packets.Subscription
	Handler InlineSubFn
}

// Subscribers contains the shared and non-shared subscribers matching a topic.
type Subscribers struct {
	Shared              map[string]map[string]packets.Subscription
	SharedSelected      map[string]packets.Subscription
	Subscriptions       map[string]packets.Subscription
	InlineSubscriptions map[int]InlineSubscription
}

// SelectShared returns one subscriber for each shared subscription group.
func (s *Subscribers) SelectShared() {
	s.SharedSelected = map[string]packets.Subscription{}
	for _, subs := range s.Shared {
		for client, sub := range subs {
			cls, ok := s.SharedSelected[client]
			if !ok {
				cls = sub
			}

			s.SharedSelected[client] = cls.Merge(sub)
			break
		}
	}
}

// MergeSharedSelected merges the selected subscribers for a shared subscription group
// and the non-shared subscribers, to ensure that no subscriber gets multiple messages
// due to have both types of subscription matching the same filter.
func (s *Subscribers) MergeSharedSelected() {
	for client, sub := range s.SharedSelected {
		cls, ok := s.Subscriptions[client]
		if !ok {
			cls = sub
		}

		s.Subscriptions[client] = cls.Merge(sub)
	}
}

// TopicsIndex is a prefix/trie tree containing topic subscribers and retained messages.
type TopicsIndex struct {
	Retained *packets.Packets
	root     *particle // a leaf containing a message and more leaves.
}

// NewTopicsIndex returns a pointer to a new instance of Index.
func NewTopicsIndex() *TopicsIndex {
	return &TopicsIndex{
		Retained: packets.NewPackets(),
		root: &particle{
			particles:     newParticles(),
			subscriptions: NewSubscriptions(),
		},
	}
}

// InlineSubscribe adds a new internal subscription for a topic filter, returning
// true if the subscription was new.
func (x *TopicsIndex) InlineSubscribe(subscription InlineSubscription) bool {
	x.root.Lock()
	defer x.root.Unlock()

	var existed bool
	n := x.set(subscription.Filter, 0)
	_, existed = n.inlineSubscriptions.Load().Get(subscription.Identifier)
	n.inlineForAdd().Add(subscription)

	return !existed
}

// InlineUnsubscribe removes an internal subscription for a topic filter associated with a specific client,
// returning true if the subscription existed.
func (x *TopicsIndex) InlineUnsubscribe(id int, filter string) bool {
	x.root.Lock()
	defer x.root.Unlock()

	particle := x.seek(filter, 0)
	if particle == nil {
		return false
	}

	particle.inlineSubscriptions.Load().Delete(id)

	if particle.inlineSubscriptions.Load().Len() == 0 {
		x.trim(particle)
	}
	return true
}

// Subscribe adds a new subscription for a client to a topic filter, returning
// true if the subscription was new.
func (x *TopicsIndex) Subscribe(client string, subscription packets.Subscription) bool {
	x.root.Lock()
	defer x.root.Unlock()

	var existed bool
	prefix, _ := isolateParticle(subscription.Filter, 0)
	if strings.EqualFold(prefix, SharePrefix) {
		group, _ := isolateParticle(subscription.Filter, 1)
		n := x.set(subscription.Filter, 2)
		_, existed = n.shared.Load().Get(group, client)
		n.sharedForAdd().Add(group, client, subscription)
	} else {
		n := x.set(subscription.Filter, 0)
		_, existed = n.subscriptions.Get(client)
		n.subscriptions.Add(client, subscription)
	}

	return !existed
}

// Unsubscribe removes a subscription filter for a client, returning true if the
// subscription existed.
func (x *TopicsIndex) Unsubscribe(filter, client string) bool {
	x.root.Lock()
	defer x.root.Unlock()

	var d int
	prefix, _ := isolateParticle(filter, 0)
	shareSub := strings.EqualFold(prefix, SharePrefix)
	if shareSub {
		d = 2
	}

	particle := x.seek(filter, d)
	if particle == nil {
		return false
	}

	if shareSub {
		group, _ := isolateParticle(filter, 1)
		particle.shared.Load().Delete(group, client)
	} else {
		particle.subscriptions.Delete(client)
	}

	x.trim(particle)
	return true
}

// RetainMessage saves a message payload to the end of a topic address. Returns
// 1 if a retained message was added, and -1 if the retained message was removed.
// 0 is returned if sequential empty payloads are received.
func (x *TopicsIndex) RetainMessage(pk packets.Packet) int64 {
	x.root.Lock()
	defer x.root.Unlock()

	n := x.set(pk.TopicName, 0)
	n.Lock()
	defer n.Unlock()
	if len(pk.Payload) > 0 {
		n.retainPath = pk.TopicName
		x.Retained.Add(pk.TopicName, pk)
		return 1
	}

	var out int64
	if pke, ok := x.Retained.Get(pk.TopicName); ok && len(pke.Payload) > 0 && pke.FixedHeader.Retain {
		out = -1 // if a retained packet existed, return -1
	}

	n.retainPath = ""
	x.Retained.Delete(pk.TopicName) // [MQTT-3.3.1-6] [MQTT-3.3.1-7]
	x.trim(n)

	return out
}

// set creates a topic address in the index and returns the final particle.
func (x *TopicsIndex) set(topic string, d int) *particle {
	var key string
	var hasNext = true
	rest := skipParticles(topic, d)
	n := x.root
	for hasNext {
		key, rest, hasNext = strings.Cut(rest, "/")

		p := n.particles.get(key)
		if p == nil {
			p = newParticle(key, n)
			n.particles.add(p)
		}
		n = p
	}

	return n
}

// seek finds the particle at a specific index in a topic filter.
func (x *TopicsIndex) seek(filter string, d int) *particle {
	var key string
	var hasNext = true
	rest := skipParticles(filter, d)
	n := x.root
	for hasNext {
		key, rest, hasNext = strings.Cut(rest, "/")
		n = n.particles.get(key)
		if n == nil {
			return nil
		}
	}

	return n
}

// trim removes empty filter particles from the index.
func (x *TopicsIndex) trim(n *particle) {
	for n.parent != nil && n.retainPath == "" && n.particles.len()+n.subscriptions.Len()+n.shared.Load().Len()+n.inlineSubscriptions.Load().Len() == 0 {
		key := n.key
		n = n.parent
		n.particles.delete(key)
	}
}

// Messages returns a slice of any retained messages which match a filter.
func (x *TopicsIndex) Messages(filter string) []packets.Packet {
	return x.scanMessages(filter, 0, nil, []packets.Packet{})
}

// scanMessages returns all retained messages on topics matching a given filter.
func (x *TopicsIndex) scanMessages(filter string, d int, n *particle, pks []packets.Packet) []packets.Packet {
	if n == nil {
		n = x.root
	}

	if len(filter) == 0 || x.Retained.Len() == 0 {
		return pks
	}

	if !strings.ContainsRune(filter, '#') && !strings.ContainsRune(filter, '+') {
		if pk, ok := x.Retained.Get(filter); ok {
			pks = append(pks, pk)
		}
		return pks
	}

	return x.scanRetained(skipParticles(filter, d), d == 0, n, pks)
}

// scanRetained is scanMessages from particle n, where rest is what is left
// of the filter (top: n is the root). It takes each level off rest once: the
// walk is linear in the filter's length (v2.7.9 rescanned the filter from
// its start for every level, quadratic in its depth).
func (x *TopicsIndex) scanRetained(rest string, top bool, n *particle, pks []packets.Packet) []packets.Packet {
	key, next, hasNext := strings.Cut(rest, "/")
	if key == "+" || key == "#" {
		if !hasNext && key == "#" {
			next = "#" // # matches every level below too
		}
		for _, adjacent := range n.particles.getAll() {
			if top && adjacent.key == SysPrefix {
				continue
			}

			if !hasNext {
				if adjacent.retainPath != "" {
					if pk, ok := x.Retained.Get(adjacent.retainPath); ok {
						pks = append(pks, pk)
					}
				}
			}

			if hasNext || key == "#" {
				pks = x.scanRetained(next, false, adjacent, pks)
			}
		}
		return pks
	}

	if particle := n.particles.get(key); particle != nil {
		if hasNext {
			return x.scanRetained(next, false, particle, pks)
		}

		if pk, ok := x.Retained.Get(particle.retainPath); ok {
			pks = append(pks, pk)
		}
	}

	return pks
}

// Subscribers returns a map of clients who are subscribed to matching filters,
// their subscription ids and highest qos.
func (x *TopicsIndex) Subscribers(topic string) *Subscribers {
	return x.scanSubscribers(topic, 0, nil, &Subscribers{
		Shared:              map[string]map[string]packets.Subscription{},
		SharedSelected:      map[string]packets.Subscription{},
		Subscriptions:       map[string]packets.Subscription{},
		InlineSubscriptions: map[int]InlineSubscription{},
	})
}

// scanSubscribers returns a list of client subscriptions matching an indexed topic address.
func (x *TopicsIndex) scanSubscribers(topic string, d int, n *particle, subs *Subscribers) *Subscribers {
	if n == nil {
		n = x.root
	}

	if len(topic) == 0 {
		return subs
	}

	return x.scanTopic(topic, skipParticles(topic, d), n, subs)
}

// scanTopic is scanSubscribers from particle n, where rest is what is left
// of topic: each level is taken off rest once, so the walk is linear in the
// topic's length (v2.7.9 rescanned the topic from its start for every level).
func (x *TopicsIndex) scanTopic(topic, rest string, n *particle, subs *Subscribers) *Subscribers {
	key, next, hasNext := strings.Cut(rest, "/")
	for _, partKey := range [2]string{key, "+"} {
		if particle := n.particles.get(partKey); particle != nil { // [MQTT-3.3.2-3]
			if hasNext {
				x.scanTopic(topic, next, particle, subs)
			} else {
				x.gatherSubscriptions(topic, particle, subs)
				x.gatherSharedSubscriptions(particle, subs)
				x.gatherInlineSubscriptions(particle, subs)

				if wild := particle.particles.get("#"); wild != nil && partKey != "+" {
					x.gatherSubscriptions(topic, wild, subs) // also match any subs where filter/# is filter as per 4.7.1.2
					x.gatherSharedSubscriptions(wild, subs)
					x.gatherInlineSubscriptions(particle, subs)
				}
			}
		}
	}

	if particle := n.particles.get("#"); particle != nil {
		x.gatherSubscriptions(topic, particle, subs)
		x.gatherSharedSubscriptions(particle, subs)
		x.gatherInlineSubscriptions(particle, subs)
	}

	return subs
}

// gatherSubscriptions collects any matching subscriptions, and gathers any identifiers or highest qos values.
func (x *TopicsIndex) gatherSubscriptions(topic string, particle *particle, subs *Subscribers) {
	if subs.Subscriptions == nil {
		subs.Subscriptions = map[string]packets.Subscription{}
	}

	particle.subscriptions.each(func(client string, sub packets.Subscription) {
		if len(sub.Filter) > 0 && topic[0] == '$' && (sub.Filter[0] == '+' || sub.Filter[0] == '#') { // don't match $ topics with top level wildcards [MQTT-4.7.1-1] [MQTT-4.7.1-2]
			return
		}

		cls, ok := subs.Subscriptions[client]
		if !ok {
			cls = sub
		}

		subs.Subscriptions[client] = cls.Merge(sub)
	})
}

// gatherSharedSubscriptions gathers all shared subscriptions for a particle.
func (x *TopicsIndex) gatherSharedSubscriptions(particle *particle, subs *Subscribers) {
	if subs.Shared == nil {
		subs.Shared = map[string]map[string]packets.Subscription{}
	}

	particle.shared.Load().each(func(_, client string, sub packets.Subscription) {
		if _, ok := subs.Shared[sub.Filter]; !ok {
			subs.Shared[sub.Filter] = map[string]packets.Subscription{}
		}

		subs.Shared[sub.Filter][client] = sub
	})
}

// gatherSharedSubscriptions gathers all inline subscriptions for a particle.
func (x *TopicsIndex) gatherInlineSubscriptions(particle *particle, subs *Subscribers) {
	if subs.InlineSubscriptions == nil {
		subs.InlineSubscriptions = map[int]InlineSubscription{}
	}

	particle.inlineSubscriptions.Load().each(func(id int, inline InlineSubscription) {
		subs.InlineSubscriptions[id] = inline
	})
}

// skipParticles returns what follows the first d levels of topic.
func skipParticles(topic string, d int) string {
	for ; d > 0; d-- {
		_, topic, _ = strings.Cut(topic, "/")
	}
	return topic
}

// TopicLevels returns the number of levels of a topic or filter.
func TopicLevels(topic string) int { return strings.Count(topic, "/") + 1 }

// isolateParticle extracts a particle between d / and d+1 / without allocations.
func isolateParticle(filter string, d int) (particle string, hasNext bool) {
	var next, end int
	for i := 0; end > -1 && i <= d; i++ {
		end = strings.IndexRune(filter, '/')

		switch {
		case d > -1 && i == d && end > -1:
			hasNext = true
			particle = filter[next:end]
		case end > -1:
			hasNext = false
			filter = filter[end+1:]
		default:
			hasNext = false
			particle = filter[next:]
		}
	}

	return
}

// IsSharedFilter returns true if the filter uses the share prefix.
func IsSharedFilter(filter string) bool {
	prefix, _ := isolateParticle(filter, 0)
	return strings.EqualFold(prefix, SharePrefix)
}

// IsValidFilter returns true if the filter is valid.
func IsValidFilter(filter string, forPublish bool) bool {
	if !forPublish && len(filter) == 0 { // publishing can accept zero-length topic filter if topic alias exists, so we don't enforce for publish.
		return false // [MQTT-4.7.3-1]
	}

	if forPublish {
		if len(filter) >= len(SysPrefix) && strings.EqualFold(filter[0:len(SysPrefix)], SysPrefix) {
			// 4.7.2 Non-normative - The Server SHOULD prevent Clients from using such Topic Names [$SYS] to exchange messages with other Clients.
			return false
		}

		if strings.ContainsRune(filter, '+') || strings.ContainsRune(filter, '#') {
			return false //[MQTT-3.3.2-2]
		}
	}

	wildhash := strings.IndexRune(filter, '#')
	if wildhash >= 0 && wildhash != len(filter)-1 { // [MQTT-4.7.1-2]
		return false
	}

	prefix, hasNext := isolateParticle(filter, 0)
	if !hasNext && strings.EqualFold(prefix, SharePrefix) {
		return false // [MQTT-4.8.2-1]
	}

	if hasNext && strings.EqualFold(prefix, SharePrefix) {
		group, hasNext := isolateParticle(filter, 1)
		if !hasNext {
			return false // [MQTT-4.8.2-1]
		}

		if strings.ContainsRune(group, '+') || strings.ContainsRune(group, '#') {
			return false // [MQTT-4.8.2-2]
		}
	}

	return true
}

// particle is a child node on the tree.
type particle struct {
	key           string         // the key of the particle
	parent        *particle      // a pointer to the parent of the particle
	particles     particles      // a map of child particles
	subscriptions *Subscriptions // a map of subscriptions made by clients to this ending address
	// shared and inlineSubscriptions are made by the particle's first shared
	// or inline subscription (Keyline's fork, PATCHES.md item 27: most nodes
	// have neither, and each empty set took 32 bytes); nil reads as empty.
	// Set under the index's root lock; read without it by the topic walk.
	shared              atomic.Pointer[SharedSubscriptions]
	inlineSubscriptions atomic.Pointer[InlineSubscriptions]
	retainPath          string // path of a retained message
	sync.Mutex                 // mutex for when making changes to the particle
}

// newParticle returns a pointer to a new instance of particle.
func newParticle(key string, parent *particle) *particle {
	return &particle{
		key:           key,
		parent:        parent,
		particles:     newParticles(),
		subscriptions: NewSubscriptions(),
	}
}

// sharedForAdd returns the particle's shared subscriptions, making them if
// it has none; the caller holds the index's root lock.
func (p *particle) sharedForAdd() *SharedSubscriptions {
	s := p.shared.Load()
	if s == nil {
		s = NewSharedSubscriptions()
		p.shared.Store(s)
	}
	return s
}

// inlineForAdd returns the particle's inline subscriptions, making them if
// it has none; the caller holds the index's root lock.
func (p *particle) inlineForAdd() *InlineSubscriptions {
	s := p.inlineSubscriptions.Load()
	if s == nil {
		s = NewInlineSubscriptions()
		p.inlineSubscriptions.Store(s)
	}
	return s
}

// particles is a concurrency safe map of particles.
type particles struct {
	internal map[string]*particle
	sync.RWMutex
}

// newParticles returns a map of particles.
// newParticles returns an empty set of particles; its map is made by the
// first add (Keyline's fork: leaf nodes have none).
func newParticles() particles {
	return particles{}
}

// add adds a new particle.
func (p *particles) add(val *particle) {
	p.Lock()
	if p.internal == nil {
		p.internal = map[string]*particle{}
	}
	p.internal[val.key] = val
	p.Unlock()
}

// getAll returns all particles.
func (p *particles) getAll() map[string]*particle {
	p.RLock()
	defer p.RUnlock()
	m := map[string]*particle{}
	for k, v := range p.internal {
		m[k] = v
	}
	return m
}

// get returns a particle by id (key).
func (p *particles) get(id string) *particle {
	p.RLock()
	defer p.RUnlock()
	return p.internal[id]
}

// len returns the number of particles.
func (p *particles) len() int {
	p.RLock()
	defer p.RUnlock()
	val := len(p.internal)
	return val
}

// delete removes a particle.
func (p *particles) delete(id string) {
	p.Lock()
	defer p.Unlock()
	delete(p.internal, id)
}
