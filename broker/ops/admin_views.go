package ops

import (
	"encoding/base64"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
)

// GroupViews lists every Key-Shared group, sorted by name.
func (a *groupAdmin) groupViews() ([]adminapi.GroupView, error) {
	sts, err := a.groups.Groups()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]adminapi.GroupView, 0, len(sts))
	names := make(map[string]bool, len(sts))
	for _, st := range sts {
		out = append(out, a.groupView(st, now))
		names[st.Info.Name] = true
	}
	a.rates.retain(names)
	return out, nil
}

// GroupDetail returns one group with its settings and per-member figures.
func (a *groupAdmin) groupDetail(name string) (adminapi.GroupView, error) {
	st, err := a.groups.Group(name)
	if err != nil {
		return adminapi.GroupView{}, err
	}
	v := a.groupView(st, time.Now())
	settings := a.s.cfg.Settings(name)
	v.Settings = &settings
	v.Settings.BacklogMaxMessages, v.Settings.BacklogMaxBytes = st.Info.Config.MaxMessages, st.Info.Config.MaxBytes
	v.Settings.BacklogPolicy = st.Info.Config.Policy.String()
	if v.Settings.BacklogPolicy == "" {
		v.Settings.BacklogPolicy = keyshared.PolicyReject.String()
	}
	// Members the hook knows (subscribed) and members the dispatcher holds
	// (live, possibly waiting for eviction) are the same set but for moments
	// in between; show the union.
	v.PerMember = []adminapi.MemberView{}
	index := map[string]int{}
	member := func(id string) *adminapi.MemberView {
		i, ok := index[id]
		if !ok {
			i = len(v.PerMember)
			index[id] = i
			v.PerMember = append(v.PerMember, adminapi.MemberView{ID: id, KeyFilters: []string{}})
		}
		return &v.PerMember[i]
	}
	for _, mi := range a.groups.MemberInfos(name) {
		m := member(mi.ID)
		m.Connected, m.QoS, m.Node = mi.Connected, mi.QoS, mi.Node
		if len(mi.KeyFilters) > 0 {
			m.KeyFilters = mi.KeyFilters
		}
	}
	for _, ms := range st.Stats.PerMember {
		m := member(ms.ID)
		m.Active, m.InFlight, m.Limit = ms.Active, ms.InFlight, ms.Limit
		m.AtLimit = ms.Limit > 0 && ms.InFlight >= ms.Limit
	}
	sort.Slice(v.PerMember, func(i, j int) bool { return v.PerMember[i].ID < v.PerMember[j].ID })
	return v, nil
}

// groupView combines a group's stored and live figures. The head comes from
// the store (current as of the last commit), the cursor from the dispatcher.
func (a *groupAdmin) groupView(st hooks.GroupStatus, now time.Time) adminapi.GroupView {
	gi, s := st.Info, st.Stats
	v := adminapi.GroupView{
		Name: gi.Name, Share: gi.Share, Filter: gi.Filter, Running: st.Running, Holder: st.Holder,
		Created: gi.Created, LastSeen: gi.LastSeen,
		Members: a.groups.Members(gi.Name),
		Head:    max(gi.Head, s.Head), Cursor: gi.Cursor, PersistedCursor: gi.Cursor,
		DeadLetters: gi.DeadLetters, StoredMessages: gi.StoredMessages, StoredBytes: gi.StoredBytes,
		BacklogDropped: gi.Dropped, BacklogRejected: gi.Rejected, UnsyncedResolutions: gi.Unsynced, Quarantined: gi.Quarantined, Lost: gi.Lost,
	}
	if v.Members == nil {
		v.Members = []string{}
	}
	if st.Running {
		v.Cursor = max(s.Cursor, gi.Cursor)
		v.Lag, v.InFlight, v.Blocked, v.BlockedKeys = s.Lag, s.InFlight, s.Blocked, s.BlockedKeys
		v.PoisonedKeys, v.MembersAtLimit = s.PoisonedKeys, s.MembersAtLimit
		v.UnroutableKeys, v.WindowBytes = s.UnroutableKeys, s.WindowBytes
		v.Counters = adminapi.GroupCounters{
			Delivered: s.Delivered, Redeliveries: s.Redeliveries, Acked: s.Acked, Nacks: s.Nacks,
			Rejects: s.Rejects, Timeouts: s.Timeouts, MemberLosses: s.MemberLosses,
			DeadLettered: s.DeadLettered, Dropped: s.Dropped, Expired: s.Expired,
			Evictions: s.Evictions, Refused: s.Refused, StaleAcks: s.StaleAcks, StoreErrors: s.StoreErrors,
		}
		v.QoS0 = adminapi.QoS0Counters{Routed: st.QoS0.Delivered, Dropped: st.QoS0.Dropped, Skipped: st.QoS0.Skipped}
	} else {
		v.Lag = gi.Backlog
	}
	if v.Head > v.Cursor {
		v.Backlog = v.Head - v.Cursor
	}
	v.Rates = a.rates.observe(gi.Name, rateSample{
		at: now, head: v.Head, delivered: v.Counters.Delivered, acked: v.Counters.Acked, dead: v.Counters.DeadLettered,
	})
	return v
}

// Preview bounds of a dead letter in a page (GET /api/v1/dlq): the payload
// is cut at adminapi.MaxPreviewBytes, the correlation data at
// previewCorrelation bytes, and user properties after previewUserBytes.
const (
	previewCorrelation = 256
	previewUserBytes   = 4 << 10
)

// deadLetterPreview is deadLetterView cut to a preview (Truncated when
// anything was left out): a page of 1,000 letters of 1 MB once meant 1 GB
// built in memory for one GET.
func deadLetterPreview(e keyshared.DeadLetterEntry) adminapi.DeadLetterView {
	m := e.Message
	cut := e
	if len(m.Payload) > adminapi.MaxPreviewBytes {
		cut.Message.Payload = m.Payload[:adminapi.MaxPreviewBytes]
	}
	if len(m.Props.CorrelationData) > previewCorrelation {
		cut.Message.Props.CorrelationData = m.Props.CorrelationData[:previewCorrelation]
	}
	n := 0
	for i, u := range m.Props.User {
		if n += len(u.Key) + len(u.Val); n > previewUserBytes {
			cut.Message.Props.User = m.Props.User[:i]
			break
		}
	}
	v := deadLetterView(cut)
	v.PayloadSize = len(m.Payload)
	v.Truncated = len(cut.Message.Payload) < len(m.Payload) || len(cut.Message.Props.CorrelationData) < len(m.Props.CorrelationData) ||
		len(cut.Message.Props.User) < len(m.Props.User)
	if v.Truncated && v.PayloadEncoding == "base64" && utf8.Valid(m.Payload[:max(len(cut.Message.Payload)-utf8.UTFMax, 0)]) {
		// The cut split a character of a text payload: show it as text.
		v.Payload, v.PayloadEncoding, _ = previewPayload(m.Payload)
	}
	return v
}

func deadLetterView(e keyshared.DeadLetterEntry) adminapi.DeadLetterView {
	m := e.Message
	v := adminapi.DeadLetterView{
		ID: e.ID, Offset: m.Offset, Key: m.Key, Topic: m.Topic, QoS: m.QoS, PayloadSize: len(m.Payload),
		ContentType: m.Props.ContentType, ResponseTopic: m.Props.ResponseTopic,
		UserProperties: make([]adminapi.UserPropertyView, 0, len(m.Props.User)),
		Attempts:       e.Attempts, ReasonCode: e.Reason, Reason: reasonText(e.Reason),
		PublishedAt: m.PublishedAt, ExpiresAt: m.ExpiresAt,
		FirstDelivery: e.FirstDelivery, LastDelivery: e.LastDelivery, DeadAt: e.DeadAt,
	}
	if utf8.Valid(m.Payload) {
		v.Payload, v.PayloadEncoding = string(m.Payload), "utf-8"
	} else {
		v.Payload, v.PayloadEncoding = base64.StdEncoding.EncodeToString(m.Payload), "base64"
	}
	if m.Props.PayloadFormatSet {
		f := m.Props.PayloadFormat
		v.PayloadFormat = &f
	}
	if len(m.Props.CorrelationData) > 0 {
		v.CorrelationData = base64.StdEncoding.EncodeToString(m.Props.CorrelationData)
	}
	for _, u := range m.Props.User {
		v.UserProperties = append(v.UserProperties, adminapi.UserPropertyView{Key: u.Key, Value: u.Val})
	}
	return v
}

// reasonText names the reason code a dead letter's last attempt ended with.
func reasonText(code byte) string {
	names := map[byte]string{
		0x00: "no reason code: ack timeout or member lost",
		0x80: "unspecified error", 0x83: "implementation specific error", 0x87: "not authorized",
		0x90: "topic name invalid", 0x91: "packet identifier in use", 0x97: "quota exceeded",
		0x99: "payload format invalid",
	}
	if n, ok := names[code]; ok {
		return fmt.Sprintf("0x%02x %s", code, n)
	}
	return fmt.Sprintf("0x%02x", code)
}
