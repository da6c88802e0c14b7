// Package adminapi is Keyline's admin API as both ends see it: the routes,
// the JSON wire types, and a typed client. The broker serves these routes
// (package broker), and the CLI and the web console call them through
// Client, so the two can never disagree on a path or a field.
package adminapi

import "time"

// Routes under /api/v1. Groups are named by the query parameter
// group=<share>/<filter> (URL-encoded: '#' as %23, '+' as %2B).
const (
	PathGroups         = "/api/v1/groups"          // GET list, DELETE ?group=
	PathGroupDetail    = "/api/v1/groups/detail"   // GET ?group=
	PathDLQ            = "/api/v1/dlq"             // GET ?group=&after=&limit=: previews
	PathDLQLetter      = "/api/v1/dlq/letter"      // GET ?group=&id=: one dead letter in full
	PathDLQReplay      = "/api/v1/dlq/replay"      // POST ?group=[&id=]
	PathDLQPurge       = "/api/v1/dlq/purge"       // POST ?group=[&id=]
	PathClients        = "/api/v1/clients"         // GET list; GET /{id}
	PathClusterClients = "/api/v1/cluster/clients" // GET: every client of the cluster and its node (cluster mode)
	PathBackup         = "/api/v1/backup"          // POST: an online backup of the data dir, as a tar stream (persistence.Backup)
	PathReload         = "/api/v1/reload"          // POST: re-read users, password file, ACL and certificates (as SIGHUP)
)

// ReloadResult answers a reload: what it did to connected clients.
type ReloadResult struct {
	// Disconnected are the clients cut off: their credentials or their
	// certificate (now revoked) no longer let them in.
	Disconnected []string `json:"disconnected"`
	// Unsubscribed counts the subscriptions removed that the ACL no longer allows.
	Unsubscribed int `json:"unsubscribed"`
	// NeedRestart names the changed settings a reload does not apply.
	NeedRestart []string `json:"need_restart,omitempty"`
}

// Dead-letter paging limits. A page of GET PathDLQ holds previews
// (DeadLetterView.Truncated) and stops, with More set, before it passes
// MaxDLQPageBytes; PathDLQLetter gives one letter in full.
const (
	DefaultDLQLimit = 100
	MaxDLQLimit     = 1000
	MaxDLQPageBytes = 4 << 20
	// MaxListedReplays bounds the replayed letters one ReplayResult lists.
	MaxListedReplays = 1000
)

// Error is the body of every answer that is not 2xx.
type Error struct {
	Error string `json:"error"`
}

// GroupList answers GET PathGroups.
type GroupList struct {
	Groups []GroupView `json:"groups"`
}

// ClientList answers GET PathClients.
type ClientList struct {
	Clients []ClientView `json:"clients"`
}

// GroupView is what the admin API shows of one Key-Shared group. Counters
// count since the group's dispatcher started (broker start or group creation).
type GroupView struct {
	Name     string    `json:"name"`
	Share    string    `json:"share"`
	Filter   string    `json:"filter"`
	Running  bool      `json:"running"`          // a dispatcher serves the group
	Holder   string    `json:"holder,omitempty"` // cluster mode: the node whose dispatcher serves it
	Created  time.Time `json:"created"`
	LastSeen time.Time `json:"last_seen"` // when the group last had members
	Members  []string  `json:"members"`   // client ids, sorted

	Head            uint64 `json:"head"`             // last offset appended to the log
	Cursor          uint64 `json:"cursor"`           // every offset <= cursor is resolved
	PersistedCursor uint64 `json:"persisted_cursor"` // the cursor no crash can take back (<= cursor)
	// UnsyncedResolutions counts acks (and other resolutions) not yet
	// durable: a crash now would deliver those messages again.
	UnsyncedResolutions uint64 `json:"unsynced_resolutions"`
	// Quarantined counts log records that could not be decoded: kept raw and skipped.
	Quarantined uint64 `json:"quarantined"`
	// Lost counts messages whose records were damaged on disk: skipped, so the group goes on.
	Lost        uint64 `json:"lost"`
	Backlog     uint64 `json:"backlog"` // head - cursor: messages not resolved yet
	Lag         uint64 `json:"lag"`     // messages not yet read into the window
	InFlight    int    `json:"in_flight"`
	Blocked     int    `json:"blocked"` // in the window, not in flight
	BlockedKeys int    `json:"blocked_keys"`
	// UnroutableKeys counts keys whose next message no member may take (key
	// filters, read access): they wait for one that may.
	UnroutableKeys  int    `json:"unroutable_keys"`
	WindowBytes     int64  `json:"window_bytes"`  // size of the messages read into memory
	PoisonedKeys    int    `json:"poisoned_keys"` // keys stopped by the block poison policy
	MembersAtLimit  int    `json:"members_at_limit"`
	DeadLetters     uint64 `json:"dead_letters"` // stored now
	StoredMessages  uint64 `json:"stored_messages"`
	StoredBytes     uint64 `json:"stored_bytes"`
	BacklogDropped  uint64 `json:"backlog_dropped"`  // dropped by the drop-oldest backlog policy (kept across restarts)
	BacklogRejected uint64 `json:"backlog_rejected"` // publishes refused at the backlog limit since start

	Counters GroupCounters `json:"counters"`
	QoS0     QoS0Counters  `json:"qos0"`
	// Rates are averaged since an earlier look at the group (an API call or a
	// metrics scrape) 1 s to 1 min ago; null until there is one.
	Rates *GroupRates `json:"rates"`

	// Detail only.
	Settings  *GroupSettingsView `json:"settings,omitempty"`
	PerMember []MemberView       `json:"per_member,omitempty"`
}

// GroupCounters count a group's dispatch outcomes.
type GroupCounters struct {
	Delivered    uint64 `json:"delivered"`    // deliveries, first ones and retries
	Redeliveries uint64 `json:"redeliveries"` // deliveries after the first of the same message
	Acked        uint64 `json:"acked"`
	Nacks        uint64 `json:"nacks"`   // nacks asking for a retry
	Rejects      uint64 `json:"rejects"` // nacks with a never-retry reason code
	Timeouts     uint64 `json:"timeouts"`
	MemberLosses uint64 `json:"member_losses"` // in-flight messages requeued because their member left
	DeadLettered uint64 `json:"dead_lettered"`
	Dropped      uint64 `json:"dropped"` // by the drop poison policy
	Expired      uint64 `json:"expired"`
	Evictions    uint64 `json:"evictions"`
	Refused      uint64 `json:"refused"` // deliveries a member could not take (not attempts)
	StaleAcks    uint64 `json:"stale_acks"`
	StoreErrors  uint64 `json:"store_errors"`
}

// QoS0Counters count a group's QoS 0 (non-reliable) routing.
type QoS0Counters struct {
	Routed  uint64 `json:"routed"`
	Dropped uint64 `json:"dropped"` // the member's queue had no room
	Skipped uint64 `json:"skipped"` // no member could take it
}

// GroupRates are per-second rates over WindowSeconds.
type GroupRates struct {
	WindowSeconds float64 `json:"window_seconds"`
	Published     float64 `json:"published_per_sec"` // appended to the log (replays included)
	Delivered     float64 `json:"delivered_per_sec"`
	Acked         float64 `json:"acked_per_sec"`
	DeadLettered  float64 `json:"dead_lettered_per_sec"`
}

// GroupSettingsView shows the settings a group runs with.
type GroupSettingsView struct {
	AckTimeout         string   `json:"ack_timeout"`
	MaxDeliveries      int      `json:"max_deliveries"`
	PoisonPolicy       string   `json:"poison_policy"`
	RetryBackoff       []string `json:"retry_backoff"`
	MemberMaxInflight  int      `json:"member_max_inflight"`
	Window             int      `json:"window"`
	BacklogMaxMessages uint64   `json:"backlog_max_messages"` // 0: no limit
	BacklogMaxBytes    uint64   `json:"backlog_max_bytes"`    // 0: no limit
	BacklogPolicy      string   `json:"backlog_policy"`
}

// MemberView is one member of a group.
type MemberView struct {
	ID         string   `json:"id"`
	Connected  bool     `json:"connected"`
	Active     bool     `json:"active"` // false: disconnected, evicted unless it returns
	QoS        byte     `json:"qos"`    // granted
	KeyFilters []string `json:"key_filters"`
	InFlight   int      `json:"in_flight"`
	Limit      int      `json:"limit"` // in-flight limit
	AtLimit    bool     `json:"at_limit"`
	Node       string   `json:"node,omitempty"` // cluster mode: the node the member is connected to
}

// DeadLetterView is one dead letter. Payload is the payload as a string when
// it is valid UTF-8 (PayloadEncoding "utf-8"), else base64 ("base64").
type DeadLetterView struct {
	ID              uint64 `json:"id"`
	Offset          uint64 `json:"offset"` // its offset in the group log when it was dead-lettered
	Key             string `json:"key"`
	Topic           string `json:"topic"`
	QoS             byte   `json:"qos"`
	Payload         string `json:"payload"`
	PayloadEncoding string `json:"payload_encoding"`
	PayloadSize     int    `json:"payload_size"`
	// Truncated: this is a preview (GET PathDLQ): the payload holds at most
	// MaxPreviewBytes, the correlation data and user properties are cut
	// too; GET PathDLQLetter has the whole letter.
	Truncated       bool               `json:"truncated,omitempty"`
	PayloadFormat   *byte              `json:"payload_format,omitempty"`
	ContentType     string             `json:"content_type,omitempty"`
	ResponseTopic   string             `json:"response_topic,omitempty"`
	CorrelationData string             `json:"correlation_data,omitempty"` // base64
	UserProperties  []UserPropertyView `json:"user_properties"`
	Attempts        int                `json:"attempts"`
	ReasonCode      byte               `json:"reason_code"` // last MQTT reason code; 0: ack timeout or member lost
	Reason          string             `json:"reason"`
	PublishedAt     time.Time          `json:"published_at"`
	ExpiresAt       time.Time          `json:"expires_at,omitzero"`
	FirstDelivery   time.Time          `json:"first_delivery,omitzero"`
	LastDelivery    time.Time          `json:"last_delivery,omitzero"`
	DeadAt          time.Time          `json:"dead_at"`
}

// UserPropertyView is one MQTT 5 user property (they may repeat, so they are a list).
type UserPropertyView struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DeadLetterPage is one page of GET /api/v1/dlq.
type DeadLetterPage struct {
	Group       string           `json:"group"`
	DeadLetters []DeadLetterView `json:"dead_letters"`
	Total       uint64           `json:"total"` // dead letters the group holds
	// More reports whether more follow; pass NextAfter as after= for them.
	More      bool   `json:"more"`
	NextAfter uint64 `json:"next_after,omitempty"`
}

// ReplayedLetter is one replayed dead letter and its new log offset.
type ReplayedLetter struct {
	ID     uint64 `json:"id"`
	Offset uint64 `json:"offset"`
	Key    string `json:"key"`
	Topic  string `json:"topic"`
}

// ReplayResult answers POST /api/v1/dlq/replay. When a replay fails part way,
// Error says why and Replayed lists what was replayed before.
type ReplayResult struct {
	Error    string           `json:"error,omitempty"`
	Group    string           `json:"group"`
	Count    int              `json:"count"`
	Replayed []ReplayedLetter `json:"replayed"`
	// Truncated: Replayed lists only the first MaxListedReplays of Count.
	Truncated bool `json:"truncated,omitempty"`
}

// PurgeResult answers POST /api/v1/dlq/purge.
type PurgeResult struct {
	Group  string `json:"group"`
	Purged int    `json:"purged"`
}

// DeleteGroupResult answers DELETE /api/v1/groups: what the group held.
type DeleteGroupResult struct {
	Deleted     string `json:"deleted"`
	Backlog     uint64 `json:"backlog"`
	DeadLetters uint64 `json:"dead_letters"`
}

// ClientView is what the admin API shows of one client.
type ClientView struct {
	ID              string `json:"id"`
	Listener        string `json:"listener"`
	Remote          string `json:"remote"`
	ProtocolVersion byte   `json:"protocol_version"`
	Connected       bool   `json:"connected"`
	Node            string `json:"node,omitempty"` // cluster mode: the node holding the client
	Subscriptions   int    `json:"subscriptions"`
	Inflight        int    `json:"inflight"`
	// Outbound queue (absent for a disconnected persistent session).
	QueuedBytes     int    `json:"queued_bytes"`
	DroppedMessages uint64 `json:"dropped_messages"`
	DroppedBytes    uint64 `json:"dropped_bytes"`
	// ConflatedMessages counts QoS 0 messages replaced in the queue by a
	// newer one of their topic (slow policy conflate).
	ConflatedMessages uint64 `json:"conflated_messages"`
	SlowPolicy        string `json:"slow_policy,omitempty"`
	QueueSoft         int    `json:"conn_queue_soft,omitempty"`
	QueueHard         int    `json:"conn_queue_hard,omitempty"`
	// Inbound: PUBLISH messages and bytes (topic and payload) read in the
	// last whole second, and the time the rate limits held the connection
	// unread (client-messages-rate, client-bytes-rate, user-rate-limits).
	MessagesInPerSec float64 `json:"messages_in_per_sec"`
	BytesInPerSec    float64 `json:"bytes_in_per_sec"`
	ThrottledSeconds float64 `json:"throttled_seconds"`
}

// ClusterClientList answers GET PathClusterClients.
type ClusterClientList struct {
	Clients []ClusterClientView `json:"clients"`
}

// ClusterClientView is one session record of the cluster.
type ClusterClientView struct {
	ID         string `json:"id"`
	Node       string `json:"node"` // the node holding the session
	Connected  bool   `json:"connected"`
	Persistent bool   `json:"persistent"`
}
