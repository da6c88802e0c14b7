// Package netpoll tells its caller when connections have bytes to read,
// without a goroutine per connection: a goroutine (a waiter) waits on one
// epoll instance for the readiness of every registered connection and runs
// the Handler of each ready one itself, without a hand-off. Before it runs
// a Handler that may block (one that has not yet run quickly: a new
// connection's CONNECT, or one whose last run was slow) it makes sure
// another waiter waits, starting one if none is free; a Handler proven quick
// runs with nobody else waiting, and a watchdog rescues the others' events
// if it blocks after all (Config.Waiters). An idle connection holds no
// goroutine, no stack and no buffer here, only its registration (a slot of
// the token table) and whatever its Handler keeps.
//
// A connection stays a net.Conn that Go's runtime owns: its writes, deadlines
// and Close go through Go's own poller as before. netpoll only adds the
// descriptor to a second epoll instance (edge-triggered, EPOLLIN|EPOLLRDHUP)
// and reads from it without blocking, through syscall.RawConn, which holds a
// reference on the descriptor for the length of the read, so a concurrent
// Close never makes a read hit a descriptor reused by another connection.
// The descriptor is never duplicated (one descriptor per connection).
//
// The second epoll instance is itself registered with Go's poller (an epoll
// descriptor is readable while it holds events): a waiter parks as a
// goroutine until the runtime sees it readable, then takes the events with
// a non-blocking epoll_wait, so no waiter holds an OS thread in a blocking
// system call (when there are several, one waits in the runtime poller at a
// time and the others queue for their turn).
//
// # Invariants
//
//  1. A connection's Handler runs in at most one goroutine at a time, and
//     runs again after every readiness event, Wake or Resume that arrived
//     while it ran (no lost wake-ups): the run state is one atomic word
//     (running, pending) and pending is cleared before each run.
//  2. Epoll events carry a token (slot index and generation), never a
//     pointer or a bare descriptor: an event for a connection that has been
//     removed (and its slot reused) finds another generation and is dropped.
//  3. Read never blocks: it returns ErrWouldBlock when the kernel holds no
//     bytes. Because registration is edge-triggered, a Handler that returns
//     before Read said ErrWouldBlock gets no further event for the bytes
//     left; it must Wake itself (or be Resumed) to read them.
//  4. Close stops the epoll goroutine and the workers; connections still
//     registered are not closed (their owners close them).
//
// # Pausing a connection (backpressure)
//
// A Handler may stop reading a connection for a while (a rate limit): it
// calls Pause and returns without reading; readiness events for it are then
// counted but do not run it, the kernel's receive buffer fills, and TCP
// flow control slows the sender. Resume runs the Handler again (once), which
// reads on. Neither costs a goroutine or a timer of netpoll's own.
package netpoll
