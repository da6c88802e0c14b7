package hooks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Wills of the clients of a node that dies.
//
// A connection's will rides in its session record (the state's
// Client.Will, with the run that wrote it: storedWill.put),
// written before its CONNACK with the record the ownership protocol writes
// anyway, and gone from it once mochi sent it (OnWillSent), the client
// disconnected normally (OnDisconnect), or another connection took the
// session (its record replaces the will with its own). So a record of a
// node that is gone that still holds a will is one nobody will send.
//
// Every node watches for that (willWatch): when a node falls silent (no
// figures for willSilent) and NATS has no responder for it, on a scan of
// every record at start (nodes that died before this one came up; this
// node's own records from an earlier run, told by storedWill.Run), and on
// the orphan sweep's once a minute, it notes each such will with the time it is due: the
// disconnect (or the time the owner was found gone) plus the will delay,
// bounded by the session expiry [MQTT-3.1.3.2.2]. When due, it claims the
// will with a compare-and-set on the record's revision (a persistent
// session keeps its record without the will; another one's record goes),
// and only the node whose claim succeeded publishes it, through the
// inline will client: forwarded to every node, retained if the will was.
// Two nodes never both publish a will, and a will is published at most
// once: a claimer that dies before publishing loses it.
//
// A node cut off from NATS longer than willSilent looks gone too, as it
// does to the orphan sweep: its clients' wills are published.

// storedWill is a will as a record holds it.
type storedWill struct {
	Topic   string
	Payload []byte
	Qos     byte
	Retain  bool
	User    []packets.UserProperty
	// Delay is the will delay interval in seconds (mochi bounds it by the
	// session expiry the client sent).
	Delay uint32
	// Run is the owner's run (Cluster.run) when it wrote the will.
	Run string
}

// put sets st's will to w (none if w is nil): the state's Client.Will
// and WillRun.
func (w *storedWill) put(st *sessionstate.State) {
	if w == nil {
		st.Client.Will, st.WillRun = storage.ClientWill{}, ""
		return
	}
	st.Client.Will = storage.ClientWill{TopicName: w.Topic, Payload: w.Payload, Qos: w.Qos, Retain: w.Retain, User: w.User,
		WillDelayInterval: w.Delay, Flag: 1}
	st.WillRun = w.Run
}

// willIn returns the will st holds, nil if none.
func willIn(st *sessionstate.State) *storedWill {
	w := &st.Client.Will
	if w.Flag == 0 {
		return nil
	}
	return &storedWill{Topic: w.TopicName, Payload: w.Payload, Qos: w.Qos, Retain: w.Retain, User: w.User, Delay: w.WillDelayInterval, Run: st.WillRun}
}

// Timings of the will watch.
const (
	// willTick is how often due wills are claimed and silent nodes checked.
	willTick = 250 * time.Millisecond
	// willSilent: a node not heard from for this long is asked whether it
	// is still there.
	willSilent = sysInterval + time.Second
)

func newRun() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// willOf returns cl's will as a record holds it, nil if it has none.
func willOf(cl *mqtt.Client, run string) *storedWill {
	w := &cl.Properties.Will
	if atomic.LoadUint32(&w.Flag) == 0 {
		return nil
	}
	return &storedWill{Topic: w.TopicName, Payload: w.Payload, Qos: w.Qos, Retain: w.Retain, User: w.User, Delay: w.WillDelayInterval, Run: run}
}

// withWill returns state (a record's State) with its will replaced by w.
func withWill(state []byte, w *storedWill) []byte {
	st := &sessionstate.State{}
	if len(state) > 0 {
		var err error
		if st, err = sessionstate.DecodeCluster("", state); err != nil {
			return state // unreadable: restore says so
		}
	}
	if willIn(st) == nil && w == nil {
		return state
	}
	w.put(st)
	return sessionstate.Encode(nil, st)
}

// lastHeard returns when each node in the table was last heard from.
func (t *nodeTable) lastHeard() map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]time.Time, len(t.nodes))
	for id, f := range t.nodes {
		out[id] = f.At
	}
	return out
}

// pendingWill is a will found orphaned, waiting until it is due.
type pendingWill struct {
	rev uint64
	due time.Time
}

// willNode is what the will watch needs of the cluster node.
type willNode interface {
	NodeID() string
	// Alive reports whether NATS has a responder for node.
	Alive(ctx context.Context, node string) (bool, error)
}

// willWatch finds and publishes the wills nobody else will send. Its loop
// runs it; the orphan sweep hands it what it finds (note). It owns the
// wills found orphaned (pending, its lock) and the nodes found gone.
type willWatch struct {
	node    willNode
	records sessionstore.Store
	run     string // this node's run: its own wills are mochi's to send
	// maxExpiry is the broker's max-session-expiry, in seconds.
	maxExpiry uint32
	// heard returns when each other node was last heard from (nodeTable).
	heard  func() map[string]time.Time
	inject injector
	inline *mqtt.Client // publishes the wills, to every node
	stats  *ClusterStats
	log    func() *slog.Logger

	gone map[string]bool // nodes found gone, until heard again (loop's)

	mu      sync.Mutex
	pending map[string]pendingWill // client id -> its orphaned will
}

// loop runs the will watch until stop: once started is closed (a will is
// published through the hooks: all of them), a scan of every record, then
// the nodes that fall silent; the orphan sweep brings the rest once a
// minute.
func (w *willWatch) loop(started, stop <-chan struct{}) {
	select {
	case <-started:
	case <-stop:
		return
	}
	t := time.NewTicker(willTick)
	defer t.Stop()
	for first := true; ; first = false {
		w.round(first, time.Now())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// round is one turn of the loop at now: the first scans every record, the
// others the records of nodes that fell silent; then the wills due go out.
func (w *willWatch) round(first bool, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if first {
		w.scan(ctx, nil, now)
	} else if dead := w.silentGone(ctx, now); len(dead) > 0 {
		w.scan(ctx, dead, now)
	}
	w.claimDue(ctx, time.Now())
}

// silentGone returns the nodes that fell silent and that NATS has no
// responder for, each once until it is heard from again.
func (w *willWatch) silentGone(ctx context.Context, now time.Time) map[string]bool {
	dead := map[string]bool{}
	var silent []string
	for id, at := range w.heard() {
		if now.Sub(at) <= willSilent {
			delete(w.gone, id)
		} else if !w.gone[id] {
			silent = append(silent, id)
		}
	}
	for _, id := range silent {
		if up, err := w.node.Alive(ctx, id); err == nil && !up {
			w.gone[id] = true
			dead[id] = true
		}
	}
	return dead
}

// scan notes the orphaned wills of the records owned by the nodes in only,
// found gone; nil: of every node that does not answer, and this node's
// earlier runs.
func (w *willWatch) scan(ctx context.Context, only map[string]bool, now time.Time) {
	self := w.node.NodeID()
	alive := map[string]bool{}
	err := w.records.ForEach(ctx, func(rec *sessionstore.Record, rev uint64) bool {
		if only != nil && !only[rec.Owner] {
			return true
		}
		st, ok := recordState(rec)
		if !ok || willIn(st) == nil || (rec.Owner == self && st.WillRun == w.run) {
			return true // none, or this run's: mochi sends it
		}
		if only == nil && rec.Owner != self {
			up, known := alive[rec.Owner]
			if !known {
				var err error
				if up, err = w.node.Alive(ctx, rec.Owner); err != nil {
					return ctx.Err() == nil // unsure: the sweep looks again
				}
				alive[rec.Owner] = up
			}
			if up {
				return true
			}
		}
		w.note(rec, rev, st, now)
		return true
	})
	if err != nil {
		w.log().Warn("cluster: looking for the wills of nodes that are gone", "error", err)
	}
}

// note keeps the will of rec (at rev, state st), whose owner was found
// gone at now, until it is due.
func (w *willWatch) note(rec *sessionstore.Record, rev uint64, st *sessionstate.State, now time.Time) {
	base := now
	if !rec.Connected && rec.DisconnectedAt > 0 {
		base = time.Unix(rec.DisconnectedAt, 0)
	}
	delay := time.Duration(st.Client.Will.WillDelayInterval) * time.Second
	if !rec.Persistent {
		delay = 0 // the session ended with its connection, and the will is due with it
	} else if expiry, ok := sessionExpiry(st, true, w.maxExpiry); ok {
		delay = min(delay, expiry)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.pending[rec.ClientID]; !ok || p.rev != rev {
		w.pending[rec.ClientID] = pendingWill{rev: rev, due: base.Add(delay)}
	}
}

// claimDue claims and publishes the wills due at now.
func (w *willWatch) claimDue(ctx context.Context, now time.Time) {
	due := map[string]uint64{}
	w.mu.Lock()
	for id, p := range w.pending {
		if !now.Before(p.due) {
			due[id] = p.rev
			delete(w.pending, id)
		}
	}
	w.mu.Unlock()
	for id, rev := range due {
		will, err := w.claim(ctx, id, rev)
		if err != nil {
			w.log().Warn("cluster: claiming the will of a client of a node that is gone", "client", id, "error", err)
			continue
		}
		if will != nil {
			w.publish(id, will)
		}
	}
}

// claim takes the will out of id's record if the record is still at rev
// and returns it; nil: someone else took it, or the session moved on.
func (w *willWatch) claim(ctx context.Context, id string, rev uint64) (*storedWill, error) {
	records := w.records
	rec, cur, err := records.Load(ctx, id)
	if err != nil || rec == nil || cur != rev {
		return nil, err
	}
	st, ok := recordState(rec)
	will := willIn(st)
	if !ok || will == nil {
		return nil, nil
	}
	if rec.Persistent {
		rec.State = withWill(rec.State, nil)
		_, err = records.Save(ctx, rec, rev)
	} else {
		err = records.Delete(ctx, id, rev)
	}
	if errors.Is(err, sessionstore.ErrRevision) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return will, nil
}

// publishWill publishes a will of another node's client as a publish of
// the inline will client: the cluster hook forwards it to every node,
// mochi delivers it here and retains it if the will was retained.
func (ww *willWatch) publish(clientID string, w *storedWill) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: w.Qos, Retain: w.Retain},
		TopicName:   w.Topic,
		Payload:     w.Payload,
		Properties:  packets.Properties{User: w.User},
	}
	if pk.FixedHeader.Qos > 0 {
		pk.PacketID = 1 // mochi validates it; an inline client's publish tracks none
	}
	if err := ww.inject.InjectPacket(ww.inline, pk); err != nil {
		ww.log().Warn("cluster: publishing the will of a client of a node that is gone", "client", clientID, "topic", clip(w.Topic), "error", err)
		return
	}
	ww.stats.Wills.Add(1)
	ww.log().Info("cluster: published the will of a client of a node that is gone", "client", clientID, "topic", clip(w.Topic))
}
