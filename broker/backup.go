package broker

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/internal/adminapi"
)

// registerBackup serves POST /api/v1/backup: an online backup of the data
// dir as a tar stream (persistence.DB.Backup; `keyline backup` reads it).
// One backup runs at a time; the route is behind the admin token like
// every /api/v1 path.
func (b *Broker) registerBackup(mux *http.ServeMux) {
	var running atomic.Bool
	mux.HandleFunc("POST "+adminapi.PathBackup, func(w http.ResponseWriter, r *http.Request) {
		if b.db == nil {
			ops.WriteJSON(w, http.StatusServiceUnavailable, adminapi.Error{Error: "no data dir is open"})
			return
		}
		if !running.CompareAndSwap(false, true) {
			ops.WriteJSON(w, http.StatusConflict, adminapi.Error{Error: "a backup is already running"})
			return
		}
		defer running.Store(false)
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", `attachment; filename="keyline-backup-`+time.Now().UTC().Format("20060102T150405Z")+`.tar"`)
		cw := &countingWriter{w: w}
		m, st, err := b.db.Backup(cw)
		if err != nil {
			// Once a byte is out the status cannot change: the stream ends
			// without its manifest, which `keyline backup` and restore refuse.
			b.log.Error("backup failed", "error", err, "bytes_sent", cw.n)
			if cw.n == 0 {
				ops.WriteJSON(w, http.StatusInternalServerError, adminapi.Error{Error: err.Error()})
			}
			return
		}
		b.log.Info("backup written", "commit", m.Commit, "files", len(m.Files), "bytes", st.Bytes,
			"snapshot", st.SnapshotTime.String(), "took", st.Total.String(), "client", r.RemoteAddr)
	})
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
