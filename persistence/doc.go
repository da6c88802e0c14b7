// Package persistence keeps Keyline's durable state in the data directory:
//
//   - segments/: the segment log of Key-Shared group messages (package
//     seglog): append-only files shared by every group and publisher, one
//     write and one fdatasync per group commit, recovered by checksum after
//     a crash, compacted so that disk follows the unresolved messages;
//   - keyline.db (FileName, bbolt): each group's identity and settings, its
//     dead letters, and the periodic checkpoint of its log state (head,
//     cursor, offsets resolved above the cursor), plus the broker's session
//     state (session records, retained and inflight messages, outboxes,
//     key filters, sysinfo).
//
// # Layout of keyline.db
//
//	meta/format           uvarint: the data format (FormatVersion; absent in format 1)
//	groups/keyline        uvarint: the next group id (ids are never reused)
//	groups/<name>/meta    JSON: group id, share name, filter, creation time, GroupConfig
//	groups/<name>/state   binary checkpoint: head, cursor, dropped, last seen,
//	                      active, resolved ranges above the cursor, lost (groupState)
//	groups/<name>/quarantine/  offset -> raw record the codec could not decode
//	groups/<name>/dlq-state  dead letters held and the last dead letter id
//	groups/<name>/dlq/    big-endian uint64 id -> encoded dead letter
//	sessions/records/     client id -> session record (SessionRecords, binary:
//	                      version, revision, flags, owner, floor, acked,
//	                      disconnected-at, then the broker's State); the
//	                      bucket's sequence is the last revision (format 3)
//	sessions/<kind>/      other session state (SessionStore), keys opaque to
//	                      this package; format 2 kept clients and
//	                      subscriptions here as mochi's JSON records
//
// A group's name is the bytes of "<share name>/<filter>" (any UTF-8; it never
// becomes a path); its messages are keyed in the segment log by its id.
//
// # Formats
//
// keyline.db records its data format (FormatVersion) and every segment file
// its own (seglog.FormatVersion). A keyline opens older data, migrating it
// in one transaction when the format changed (keyline.db) or leaving old
// segments as they are until their records resolve (segments); it refuses
// newer data with one line naming the file and both formats, before
// changing anything.
//
// # Invariants
//
//   - Offsets start at 1, increase by one with every append and are never
//     reused, not even after resolutions, drops or replays.
//   - One goroutine writes keyline.db (the committer), many operations per
//     transaction; each operation succeeds or fails on its own, and a caller
//     is answered only after the commit that holds its operation.
//   - A group's dead letters and its dlq-state change in one transaction.
//   - A message is appended to the segment log before its publisher is
//     acknowledged; a resolution reaches the log with its next commit, and a
//     checkpoint makes everything resolved before it durable.
//
// # Caveats
//
//   - With Options.NoSync neither the log nor the file is fsynced: data
//     survives a crash of the process but not of the machine.
//   - A crash loses the resolutions of the log's last commit interval (at
//     most a few milliseconds): those messages are delivered again.
//   - Member counts and last-seen times are written with checkpoints (every
//     Options.CheckpointInterval), not at once.
//   - Replaying a dead letter appends its message, then deletes the letter: a
//     crash in between keeps both.
//   - Rejected counts refusals since the store was opened; everything else in
//     GroupInfo survives a restart.
package persistence
