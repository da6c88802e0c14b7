// Package persistence keeps Keyline's durable state in one bbolt file
// (FileName under the data directory): the Key-Shared group logs, cursors and
// dead letters, and mochi's session state (clients, subscriptions, retained
// and inflight messages, sysinfo).
//
// # Layout
//
// Group data lives under the top-level bucket "groups", one nested bucket per
// group keyed by the group name's bytes ("<share name>/<filter>", any UTF-8; it
// never becomes a path):
//
//	groups/<name>/meta   JSON: share name, filter, creation time, GroupConfig
//	groups/<name>/state  binary: head, first stored offset, cursor, stored
//	                     messages and bytes, dropped, dead letters, last dead
//	                     letter id, last seen, active (see groupState)
//	groups/<name>/log/   big-endian uint64 offset -> encoded message (codec.go)
//	groups/<name>/dlq/   big-endian uint64 id -> encoded dead letter
//
// Session state lives under its own top-level bucket "sessions".
//
// # Invariants
//
//   - Offsets start at 1, increase by one with every append and are never
//     reused, not even after trimming, dropping or replaying.
//   - A log holds exactly the offsets first..head: entries leave only from the
//     front (trimming at or below the cursor, or the drop-oldest policy).
//   - The cursor only moves forward and never passes the head.
//   - A group's state key and its log and dead letters change in the same
//     transaction, so they always agree; Open checks that they do.
//   - Only the committer goroutine writes group data, many operations per
//     transaction (group commit); each caller is answered after the commit that
//     holds its operation, and in-memory figures change only after that commit.
//
// # Caveats
//
//   - With Options.NoSync a commit is not fsynced: data survives a crash of the
//     process but not of the machine.
//   - Trimming below the cursor happens after the cursor is saved, a bounded
//     number of entries per transaction; StoredMessages may lag Backlog briefly.
//   - Rejected counts refusals since the store was opened; everything else in
//     GroupInfo is persisted.
package persistence
