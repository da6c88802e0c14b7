package persistence

import (
	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence/seglog"
)

// segLog is one group's keyshared.Log over the store: messages from the
// segment log (its tail cache first, disk below it), resolutions into the
// segment log, dead letters into the data file.
type segLog struct {
	s   *Groups
	g   *group
	buf []seglog.Entry // reused by ReadFrom (the dispatcher calls from one goroutine)
}

var _ keyshared.Log = (*segLog)(nil)

// ReadFrom reads the group's unresolved messages. A record the codec cannot
// decode is quarantined (kept raw in the data file, counted, logged) and
// resolved, so that one bad record never stalls its group.
func (l *segLog) ReadFrom(from uint64, max int, buf []keyshared.Message) ([]keyshared.Message, error) {
	es, err := l.s.log.ReadFrom(l.g.meta.ID, from, max, l.buf[:0])
	var bad []uint64
	for i := range es {
		// Entries are immutable and kept alive by the messages viewing them.
		m, derr := keyshared.DecodeMessage(es[i].Data, false)
		if derr != nil {
			l.s.quarantine(l.g, es[i].Offset, es[i].Data, derr)
			bad = append(bad, es[i].Offset)
			continue
		}
		m.Offset = es[i].Offset
		buf = append(buf, m)
	}
	if len(bad) > 0 {
		l.s.log.Resolve(l.g.meta.ID, bad)
	}
	clear(es)
	l.buf = es[:0]
	return buf, logError(l.g.name, err)
}

func (l *segLog) Head() uint64 {
	info, err := l.s.log.Group(l.g.meta.ID)
	if err != nil {
		return 0
	}
	return info.Head
}

func (l *segLog) LoadCursor() (uint64, error) {
	info, err := l.s.log.Group(l.g.meta.ID)
	return info.Cursor, logError(l.g.name, err)
}

func (l *segLog) Resolve(offsets []uint64) { l.s.log.Resolve(l.g.meta.ID, offsets) }

func (l *segLog) DeadLetter(d keyshared.DeadLetter) error {
	d.Group = l.g.name
	v := keyshared.AppendDeadLetter(nil, &d)
	return l.s.dlqOp(l.g, func(bk *bolt.Bucket, st *dlqState) error {
		id := st.seq + 1
		if err := bk.Bucket(dlqBucket).Put(be64(id), v); err != nil {
			return fatal(err)
		}
		st.seq, st.count = id, st.count+1
		return nil
	})
}
