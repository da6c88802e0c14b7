package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keyline-mq/keyline/persistence/seglog"
)

// SpillDir is the data dir's subdirectory of the session outboxes' spill
// files (internal/outbox.Spill): not durable, emptied at every start.
const SpillDir = "spill"

// checkDataDir refuses to start over a data directory whose database file
// is gone while the rest of the directory says it existed: a missing file
// beside segments that hold records, or an empty file beside anything at all
// (bbolt would initialise both as new databases, and the segment log would
// then take every record for garbage and delete it).
func checkDataDir(dir, path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		segs := filepath.Join(dir, SegmentsDir)
		has, err := seglog.HasRecords(segs)
		if err != nil {
			return fmt.Errorf("persistence: %s: %w", segs, err)
		}
		if has {
			return fmt.Errorf("%w: %s, but %s holds group messages: the groups, cursors and sessions it recorded are gone; restore it from a backup, or move the data dir aside to start empty",
				ErrMissingFile, path, segs)
		}
	case err != nil:
		return nil // bbolt reports it
	case fi.Size() == 0:
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("persistence: read data dir: %w", err)
		}
		for _, e := range ents {
			if e.Name() != FileName && e.Name() != "lost+found" && e.Name() != SpillDir {
				return fmt.Errorf("%w: %s, in a data dir that holds %s: the groups and sessions it recorded are lost; restore it from a backup, or move the data dir aside to start empty",
					ErrEmptyFile, path, filepath.Join(dir, e.Name()))
			}
		}
	}
	return nil
}
