package adminapi

import (
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Routes added for the web console, usable by the CLI and scripts alike.
const (
	PathOverview      = "/api/v1/overview"        // GET: broker figures and their recent history
	PathGroupMessages = "/api/v1/groups/messages" // GET ?group=&limit=: the oldest messages after the cursor
	PathGroupActivity = "/api/v1/groups/activity" // GET ?group=: recent delivery and ack rates
	PathTopicStream   = "/api/v1/topics/stream"   // GET ?filter=: live messages, text/event-stream
	// POST PathClients + "/{id}/disconnect" disconnects a client (ClientDisconnect).
)

// Limits of the console routes.
const (
	DefaultGroupMessages = 20
	MaxGroupMessages     = 200
	// MaxClientInflight bounds the inflight messages a ClientDetail lists.
	MaxClientInflight = 100
)

// SessionCookie is the cookie the console's login sets: a browser cannot send
// a bearer header when it navigates, so the admin API accepts this cookie
// wherever it accepts the bearer token. Its value is the id of a session the
// broker keeps (random, with an expiry; logout ends it).
const SessionCookie = "keyline_session"

// Overview shows the broker's figures and their recent history.
func Overview() Route[OverviewView] { return Route[OverviewView]{http.MethodGet, PathOverview, nil} }

// GroupMessages lists up to limit messages of group after its cursor, oldest first.
func GroupMessages(group string, limit int) Route[GroupMessagesView] {
	return Route[GroupMessagesView]{http.MethodGet, PathGroupMessages, url.Values{
		"group": {group}, "limit": {strconv.Itoa(limit)}}}
}

// GroupActivity shows a group's recent delivery and ack rates.
func GroupActivity(group string) Route[GroupActivityView] {
	return Route[GroupActivityView]{http.MethodGet, PathGroupActivity, url.Values{"group": {group}}}
}

// ClientDisconnect disconnects a connected client (MQTT 5: DISCONNECT 0x98
// administrative action). A persistent session stays.
func ClientDisconnect(id string) Route[DisconnectResult] {
	return Route[DisconnectResult]{http.MethodPost, PathClients + "/" + url.PathEscape(id) + "/disconnect", nil}
}

// OverviewView answers GET PathOverview. Counters count since the broker started.
type OverviewView struct {
	StartedAt     time.Time `json:"started_at"`
	UptimeSeconds float64   `json:"uptime_seconds"`

	ClientsConnected    int64 `json:"clients_connected"`
	ClientsDisconnected int64 `json:"clients_disconnected"` // persistent sessions without a connection
	ClientsMaximum      int64 `json:"clients_maximum"`
	Subscriptions       int64 `json:"subscriptions"`
	Retained            int64 `json:"retained_messages"`
	InflightMessages    int64 `json:"inflight_messages"`

	MessagesReceived uint64 `json:"messages_received"`
	MessagesSent     uint64 `json:"messages_sent"`
	MessagesDropped  uint64 `json:"messages_dropped"` // a client's outbound queue was full
	InflightDropped  uint64 `json:"inflight_dropped"`
	BytesReceived    uint64 `json:"bytes_received"`
	BytesSent        uint64 `json:"bytes_sent"`
	SlowDisconnects  uint64 `json:"slow_disconnects"`
	QueuedBytes      int64  `json:"queued_bytes"` // in connected clients' outbound queues

	Groups       int    `json:"groups"`
	GroupBacklog uint64 `json:"group_backlog"` // unresolved messages over all groups (as last committed)
	DeadLetters  uint64 `json:"dead_letters"`

	DataFile      string `json:"data_file"`
	DataFileBytes int64  `json:"data_file_bytes"`

	// Rates are per second over the last few seconds; null until the
	// broker has sampled its counters twice.
	Rates *OverviewSample `json:"rates"`
	// History holds one sample per SampleSeconds, oldest first, for the
	// last few minutes (the broker samples its counters in the process).
	SampleSeconds float64          `json:"sample_seconds"`
	History       []OverviewSample `json:"history"`
}

// OverviewSample is the broker's activity over one interval ending At.
type OverviewSample struct {
	At               time.Time `json:"at"`
	MessagesIn       float64   `json:"messages_in_per_sec"`
	MessagesOut      float64   `json:"messages_out_per_sec"`
	Dropped          float64   `json:"dropped_per_sec"` // queue drops and inflight drops
	BytesIn          float64   `json:"bytes_in_per_sec"`
	BytesOut         float64   `json:"bytes_out_per_sec"`
	ClientsConnected int64     `json:"clients_connected"`
}

// GroupMessagesView answers GET PathGroupMessages: the oldest messages of the
// group's log after its cursor. Some of them may be resolved already (an ack
// above the cursor does not move it); State tells what is known.
type GroupMessagesView struct {
	Group    string               `json:"group"`
	Cursor   uint64               `json:"cursor"`
	Head     uint64               `json:"head"`
	Messages []PendingMessageView `json:"messages"`
	// More reports whether the log holds more messages after the last one listed.
	More bool `json:"more"`
}

// PendingMessageView is one message of a group log. Payload follows the
// rules of DeadLetterView (utf-8 or base64) and holds at most
// MaxPreviewBytes; PayloadSize is the whole payload's.
type PendingMessageView struct {
	Offset          uint64    `json:"offset"`
	Key             string    `json:"key"`
	Topic           string    `json:"topic"`
	QoS             byte      `json:"qos"`
	PayloadSize     int       `json:"payload_size"`
	Payload         string    `json:"payload"`
	PayloadEncoding string    `json:"payload_encoding"`
	Truncated       bool      `json:"truncated,omitempty"`
	PublishedAt     time.Time `json:"published_at"`
	ExpiresAt       time.Time `json:"expires_at,omitzero"`
	// State is where the message stands, as the group's dispatcher answers
	// at the moment of the request: one of the Message* states.
	State string `json:"state"`
	// InFlightTo names the member the message is delivered to and awaits an
	// answer from, when State is MessageInFlight.
	InFlightTo string `json:"in_flight_to,omitempty"`
	// Attempts counts the message's failed deliveries so far (nacks, ack
	// timeouts, member losses).
	Attempts int `json:"attempts,omitempty"`
}

// States of a PendingMessageView (the names of keyshared.MessageState).
const (
	MessageInFlight      = "in-flight"      // delivered, not acknowledged yet
	MessageWaiting       = "waiting"        // behind its key's message in flight, or for a member with room
	MessageResolved      = "resolved"       // acknowledged, dead-lettered or expired; the cursor has not passed it yet
	MessageRetrying      = "retrying"       // an attempt failed; it waits out its backoff
	MessagePoisoned      = "poisoned"       // out of attempts under the block policy; its key is stopped
	MessageDeadLettering = "dead-lettering" // to be dead-lettered; the store failed and it is retried
	MessageUnread        = "unread"         // not read into the dispatch window yet (no member, or the window is full)
)

// MaxPreviewBytes bounds the payload bytes a PendingMessageView or TopicEvent carries.
const MaxPreviewBytes = 1024

// GroupActivityView answers GET PathGroupActivity. The broker samples a group
// once a second for some minutes after the last request for its activity, so
// the first request starts a history the next ones see.
type GroupActivityView struct {
	Group         string        `json:"group"`
	SampleSeconds float64       `json:"sample_seconds"`
	History       []GroupSample `json:"history"` // oldest first
}

// GroupSample is a group's activity over one interval ending At.
type GroupSample struct {
	At           time.Time `json:"at"`
	Published    float64   `json:"published_per_sec"`
	Delivered    float64   `json:"delivered_per_sec"`
	Acked        float64   `json:"acked_per_sec"`
	DeadLettered float64   `json:"dead_lettered_per_sec"`
	Backlog      uint64    `json:"backlog"`
	InFlight     int       `json:"in_flight"`
}

// ClientDetail answers GET PathClients/{id}: the ClientView fields and the
// client's subscriptions and QoS 1/2 messages in flight or queued.
type ClientDetail struct {
	ClientView
	Username          string             `json:"username,omitempty"`
	KeepAlive         uint16             `json:"keep_alive"`
	Clean             bool               `json:"clean"`
	SubscriptionList  []SubscriptionView `json:"subscription_list"`
	InflightMessages  []InflightView     `json:"inflight_messages"` // at most MaxClientInflight
	InflightTruncated bool               `json:"inflight_truncated,omitempty"`
}

// SubscriptionView is one subscription of a client.
type SubscriptionView struct {
	Filter            string `json:"filter"`
	QoS               byte   `json:"qos"`
	NoLocal           bool   `json:"no_local,omitempty"`
	RetainAsPublished bool   `json:"retain_as_published,omitempty"`
	RetainHandling    byte   `json:"retain_handling,omitempty"`
	Identifier        int    `json:"identifier,omitempty"`
}

// InflightView is one QoS 1/2 message of a session, in flight or queued.
type InflightView struct {
	PacketID    uint16    `json:"packet_id"`
	Topic       string    `json:"topic"`
	QoS         byte      `json:"qos"`
	PayloadSize int       `json:"payload_size"`
	Created     time.Time `json:"created"`
}

// DisconnectResult answers POST PathClients/{id}/disconnect.
type DisconnectResult struct {
	Disconnected string `json:"disconnected"`
	// SessionKept reports whether the client's persistent session stays.
	SessionKept bool `json:"session_kept"`
}

// TopicEvent is the data of one "message" event of PathTopicStream. Payload
// holds at most MaxPreviewBytes, as text (PayloadEncoding "utf-8") or base64.
type TopicEvent struct {
	Topic           string    `json:"topic"`
	QoS             byte      `json:"qos"`
	Retain          bool      `json:"retain,omitempty"`
	Payload         string    `json:"payload"`
	PayloadEncoding string    `json:"payload_encoding"`
	PayloadSize     int       `json:"payload_size"`
	Truncated       bool      `json:"truncated,omitempty"`
	At              time.Time `json:"at"`
}

// TopicStreamStats is the data of a "stats" event of PathTopicStream, sent
// every few seconds: what the stream showed and what it left out to stay
// within its rate.
type TopicStreamStats struct {
	Filter  string `json:"filter"`
	Sent    uint64 `json:"sent"`
	Skipped uint64 `json:"skipped"` // matched but over the stream's rate or buffer
	// RatePerSec is the most messages a second the stream sends.
	RatePerSec int `json:"rate_per_sec"`
}
