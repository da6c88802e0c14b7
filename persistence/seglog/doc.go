// Package seglog is the write-ahead log of Keyline's Key-Shared group
// messages: append-only segment files shared by all groups and publishers,
// with one write and one fdatasync per group commit. Messages are opaque
// bytes (the caller encodes them). Group metadata, dead letters and the
// periodic checkpoints of each group's state stay in bbolt: Checkpoint
// returns what a checkpoint holds, Open takes it back.
//
// # Files and framing
//
// Segments live in Options.Dir as "<20-digit id>.seg", ids increasing, each
// Options.SegmentSize bytes, pre-zeroed when created (in the background, one
// spare ahead). A segment of format 2 (FormatVersion) starts with a 32-byte
// header: magic "KLSG", the format, the segment id, the size it was created
// with and a CRC-32C of those. A frame is
//
//	uint32 LE body length | uint32 LE CRC-32C (Castagnoli) of body |
//	uint32 LE CRC-32C of the 8 bytes before | body
//
// and a zero header marks the end of a segment's data. Bodies:
//
//	shared     4 | uvarint n | n × (uvarint group, uvarint offset) | message bytes
//	moved      5 | same as shared: a copy written by compaction
//	resolve    3 | uvarint group | uvarint count | count × (uvarint gap from the previous range's end, uvarint length)
//
// An append to many groups stores its message once, for all of them (one
// shared record per append), so disk and the room a commit needs grow with
// the message, not with the number of groups that take it.
//
// Format 1 segments (written before formats had a number) have no header,
// 8-byte frame headers (no header checksum), and one record per group:
// message (1) and moved (2), each "type | uvarint group | uvarint offset |
// message bytes". They are read, never written: the first commit after Open
// goes to a new segment, and a format 1 spare gets a header first. A segment
// of a newer format makes Open fail (ErrNewerFormat) before anything is
// changed.
//
// # Groups
//
// A group (a uint64 id the caller assigns and never reuses) has a head (the
// highest offset appended), a cursor (every offset <= cursor is resolved),
// the resolved offsets above the cursor as ranges, and an index of runs: a
// run is a stretch of offsets first..last whose unresolved messages all lie
// in one segment between two byte positions. Appends extend the last run;
// so memory grows with runs (about one per group and segment holding its
// live messages), resolved ranges and segments, never with the number of
// messages in the backlog. Limits bound the unresolved messages and bytes
// at append time: refusal (ErrBacklogFull) or, with DropOldest, resolving
// the oldest unresolved messages in the same commit.
//
// # Invariants
//
//  1. Offsets start at 1, increase by one with each append of a group and are
//     never reused. A group id is never reused: AddGroup refuses a dropped id
//     or one whose records Open found without a checkpoint.
//  2. Only the writer goroutine writes segment files. A commit is one write
//     and one fdatasync (none with NoSync) into the active segment; a batch
//     is cut where the segment fills, so a commit never spans segments and
//     a torn commit can only be the tail of the last segment with data.
//  3. Heads, runs, the tail cache and segment counters change only after the
//     commit that wrote them is durable; callbacks run after that, on the
//     notifier goroutine, in submission order, and OnAppend after the
//     callbacks of its commit.
//  4. cursor <= head; the resolved ranges lie in cursor+2..head (the cursor
//     advances over a range that starts at cursor+1).
//  5. Runs of a group are sorted and disjoint; within a run byte positions
//     increase with offsets; every offset of a run's range is either live in
//     that run or resolved. Runs without live messages are removed.
//  6. A segment's live count is the number of live group references (a
//     group's unresolved offset) the runs place in it; a sealed segment's
//     live count never grows.
//  7. A sealed segment is deleted only once it has no live message and a
//     checkpoint taken after it was sealed was persisted (Checkpointed): its
//     resolve records may concern messages in older segments.
//  8. A group's tail cache holds every unresolved offset from its start to
//     the head, contiguously; ReadFrom reads below it from disk.
//
// # Recovery
//
// Open loads the given checkpoints and scans every segment in order without
// holding payloads: records of unknown groups are garbage; a message is live
// for a group if it is above the cursor and not resolved (resolve records
// apply as they are met, including before a moved copy of their offset); a
// moved copy of an offset that is indexed already is ignored; the head is
// the larger of the checkpoint's and the highest offset seen. A bad frame
// (a checksum mismatch, an impossible length, an undecodable body) is
// skipped to the next good frame (resync: the frame's own extent when its
// header is good, else the next position whose header and body check): the
// bytes in between are damage, copied (up to 4 MiB) to
// Dir/quarantine/<segment>-<pos>.bin and reported (RecoveryReport.Damage).
// Only a bad frame that no good frame follows in the last segment with data
// is the torn tail of the last commit: it and everything after it is zeroed
// (RecoveryReport.TornBytes). Unresolved offsets left without a record are
// resolved and counted as lost (GroupInfo.Lost), so that the cursor can pass
// them. A damaged header, or a file shorter than its header says, is
// reported too.
//
// ReadFrom handles damage that appears after Open the same way: a bad frame
// in a run is skipped to the next good one, its bytes quarantined, and the
// group's offsets it held resolved as lost (durably, with the next commit),
// so that a damaged record never stalls its group.
//
// # Space
//
// Disk follows the unresolved messages, not the oldest one: a sealed
// segment whose live group references fall below CompactLiveRatio of its
// references, and whose live records (a shared record is live while one of
// its groups needs it) fill less than that fraction of its bytes, has them
// copied forward as moved records through the writer (in chunks of at most
// 1 MiB, in their order, each for the groups that still need it); once
// durable, the index points at the copies and the old segment becomes
// garbage, deleted after the next persisted checkpoint. One message nobody
// acknowledges thus keeps only its own record on disk, copied forward now
// and then. A segment the compactor looked at and kept is looked at again
// once its live references have halved.
//
// # Commits
//
// The writer takes what is queued and holds it back for more appends
// (Options.CommitInterval, default 1 ms): until the batch holds as many
// appends as the last commit answered plus those queued while it ran (an
// appender with several appends in flight sends the next ones as it is
// answered: one commit then carries its whole window), and at least
// Options.CommitMinAppends, or the interval after its oldest append was
// queued. An append is answered at most CommitInterval plus one commit after
// it was queued, or after the commit running when it was queued ended.
// Options.AfterCallbacks runs once a commit's callbacks ran, for work they
// deferred (the broker writes the acknowledgements they released there).
//
// # Caveats
//
//   - Resolve is durable with the next commit (an append commit, or alone
//     after ResolveDelay): a crash loses at most the resolutions of that
//     interval, and their messages are delivered again (at least once).
//   - Checkpoint includes resolutions not yet written to the log; persisting
//     the snapshot makes them durable. Snapshots must be persisted in the
//     order they were taken (Checkpointed ignores an older one).
//   - Records of a commit that crashed between its write and its fdatasync
//     may survive although nobody was told; a publisher that retries then
//     duplicates its message.
//   - A torn commit whose later frames reached the disk while an earlier
//     one did not leaves good frames after a bad one: they are kept (their
//     publishers were not told), and the bad frame is reported as damage.
//   - GroupInfo.Bytes (and MaxBytes) is exact while each run's messages have
//     one size; resolving a message that is no longer cached subtracts its
//     run's average size, so the figure can be off by the size differences
//     within a run, and is exact again when the run is fully resolved.
//   - The resolve record of a drop-oldest of committed messages goes in the
//     commit of the append that caused it unless the segment is nearly
//     full; then it goes in the next commit.
//   - A write or fdatasync error stops the writer for good (ErrFailed):
//     after a failed fdatasync the file's state is unknown; reopen the log.
//   - The tail cache holds the caller's message slices: a message must not
//     be modified after Append.
//   - A callback that syncs or closes the log says so: SyncFromCallback waits
//     only for durability, not for the callbacks queued behind the running
//     one; CloseFromCallback does not wait for them either (the notifier
//     goroutine ends after they ran). Sync or Close from a callback would
//     wait for the callback itself.
//   - ReadFrom below the cache reads the runs' byte ranges, skipping other
//     groups' records: a fresh reader of an old, interleaved backlog reads
//     more than its own bytes (a per-group hint makes consecutive reads
//     continue where the last one stopped).
//
// README.md in this directory has the benchmark figures and the fdatasync
// latencies measured on the development machine.
package seglog
