package broker

import (
	"maps"
	"os"
	"slices"
	"time"
)

// fileStamp is what the reload watch compares of a file: its modification
// time and size, or that it is missing.
type fileStamp struct {
	mod     time.Time
	size    int64
	missing bool
}

// reloadFiles are the files a reload reads, in the configuration in force:
// the config file, the password file, the TLS material and the JWT keys.
func (b *Broker) reloadFiles() []string {
	b.reload.mu.Lock()
	c := b.reload.last
	b.reload.mu.Unlock()
	var out []string
	for _, f := range []string{c.ConfigFile, c.PasswordFile, c.TLSCert, c.TLSKey, c.TLSClientCA, c.TLSCRL, c.JWTKey} {
		if f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

func stampFiles(files []string) map[string]fileStamp {
	out := make(map[string]fileStamp, len(files))
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			out[f] = fileStamp{missing: true}
			continue
		}
		out[f] = fileStamp{mod: st.ModTime(), size: st.Size()}
	}
	return out
}

// watchReloadFiles (reload-watch) polls the files a reload reads every
// interval, comparing modification times and sizes (os.Stat: no inotify,
// so it works on every file system, network and container mounts too), and
// reloads once a change has stayed the same for one more interval, so that
// a file caught half-written is not applied. A reload that fails is logged
// and counted as SIGHUP's is, and the files are not tried again until they
// change once more.
func (b *Broker) watchReloadFiles(interval time.Duration) {
	// A deliberate wall-clock poll: it watches files other processes write.
	tick := time.NewTicker(interval)
	defer tick.Stop()
	applied := stampFiles(b.reloadFiles())
	var seen map[string]fileStamp // the last poll's stamps, when they differed from applied
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		now := stampFiles(b.reloadFiles())
		if maps.Equal(now, applied) {
			seen = nil
			continue
		}
		if !maps.Equal(now, seen) {
			seen = now // changed: wait one interval for the writer to finish
			continue
		}
		var changed []string
		for f, s := range now {
			if applied[f] != s {
				changed = append(changed, f)
			}
		}
		slices.Sort(changed)
		b.log.Info("files changed: reloading", "files", changed)
		_, _ = b.Reload() // logged and counted by Reload
		// What was read is now: a file written during the reload is a
		// change still to apply. Files the new configuration names afresh
		// are stamped as they are; those it no longer names are dropped.
		fresh := stampFiles(b.reloadFiles())
		for f := range fresh {
			if s, ok := now[f]; ok {
				fresh[f] = s
			}
		}
		applied, seen = fresh, nil
	}
}
