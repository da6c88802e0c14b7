package sessionstate

import (
	"encoding/json"
	"fmt"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// legacyCluster is the JSON cluster mode wrote in a session record's State
// before it used this encoding.
type legacyCluster struct {
	Client storage.Client `json:"client"`
	Subs   []struct {
		storage.Subscription
		Since uint64 `json:"since"`
	} `json:"subs,omitempty"`
	KeyFilters map[string][]string `json:"kf,omitempty"`
	Will       *struct {
		Topic   string                 `json:"topic"`
		Payload []byte                 `json:"payload,omitempty"`
		Qos     byte                   `json:"qos,omitempty"`
		Retain  bool                   `json:"retain,omitempty"`
		User    []packets.UserProperty `json:"user,omitempty"`
		Delay   uint32                 `json:"delay,omitempty"`
		Run     string                 `json:"run"`
	} `json:"will,omitempty"`
}

// DecodeCluster decodes the state of client id from a cluster session
// record (KL_SESSIONS): this encoding, or the JSON object the releases
// before it wrote there (its first byte, '{', is no version), so records
// older nodes left keep working. The result is what Decode returns for the
// same state.
func DecodeCluster(id string, b []byte) (*State, error) {
	if len(b) == 0 || b[0] != '{' {
		return Decode(id, b)
	}
	var js legacyCluster
	if err := json.Unmarshal(b, &js); err != nil {
		return nil, fmt.Errorf("%w: JSON state: %w", ErrCorrupt, err)
	}
	st := &State{Client: js.Client, KeyFilters: js.KeyFilters}
	st.Client.ID, st.Client.T = id, storage.ClientKey
	if w := js.Will; w != nil {
		st.Client.Will = storage.ClientWill{TopicName: w.Topic, Payload: w.Payload, Qos: w.Qos, Retain: w.Retain, User: w.User,
			WillDelayInterval: w.Delay, Flag: 1}
		st.WillRun = w.Run
	}
	if len(js.Subs) > 0 {
		st.Subs = make([]Sub, len(js.Subs))
	}
	for i, s := range js.Subs {
		s.ID, s.T, s.Client = s.Filter, storage.SubscriptionKey, id
		st.Subs[i] = Sub{Subscription: s.Subscription, Since: s.Since}
	}
	for f, kf := range st.KeyFilters {
		if len(kf) == 0 {
			st.KeyFilters[f] = nil
		}
	}
	if len(st.KeyFilters) == 0 {
		st.KeyFilters = nil
	}
	return st, nil
}
