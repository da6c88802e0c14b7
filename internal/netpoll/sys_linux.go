//go:build linux

package netpoll

import (
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wakeToken is the eventfd's token: no connection has generation 0.
const wakeToken = 0

// sysPoller is one epoll instance. Its descriptor is itself registered with
// Go's runtime poller (an epoll descriptor is readable while it holds
// events), so a waiter parks as a goroutine until events come and then takes
// them with a non-blocking epoll_wait, instead of holding a thread in a
// blocking epoll_wait. A thread blocked in a system call is what made each
// wake-up of an idle broker expensive: the runtime's monitor took the
// blocked thread's P away every 10 ms and so kept polling every 20 µs
// (2,300 nanosleeps a second with 10,000 idle devices publishing once a
// minute), and each returning waiter had to find a P again and wake another
// thread (futex). Now the thread that the runtime's own epoll_wait wakes
// runs the waiter directly. Where the runtime cannot poll the descriptor,
// waiters block in epoll_wait as before (blocking).
type sysPoller struct {
	epfd, evfd int
	file       *os.File        // owns epfd once made
	rc         syscall.RawConn // file's, for waiting through the runtime poller
	blocking   bool
}

// waitBuf is one waiter's buffer for epoll_wait, with the result of the
// last one and the callback that makes it (built once per waiter, so a wait
// allocates nothing).
type waitBuf struct {
	events [maxEvents]unix.EpollEvent
	n      int
	err    error
	take   func(uintptr) bool
}

func (s *sysPoller) open() error {
	var err error
	if s.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if s.evfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		_ = unix.Close(s.epfd)
		return err
	}
	if err := s.ctl(unix.EPOLL_CTL_ADD, s.evfd, unix.EPOLLIN, wakeToken); err != nil {
		_ = unix.Close(s.evfd)
		_ = unix.Close(s.epfd)
		return err
	}
	// os.NewFile registers a non-blocking descriptor with the runtime
	// poller; a file that takes a deadline is one it polls.
	if err := unix.SetNonblock(s.epfd, true); err != nil {
		_ = unix.Close(s.evfd)
		_ = unix.Close(s.epfd)
		return err
	}
	s.file = os.NewFile(uintptr(s.epfd), "netpoll-epoll")
	if s.rc, err = s.file.SyscallConn(); err != nil || s.file.SetReadDeadline(time.Time{}) != nil {
		s.blocking = true
	}
	return nil
}

func (s *sysPoller) ctl(op, fd int, events uint32, token uint64) error {
	ev := unix.EpollEvent{Events: events}
	putToken(&ev, token)
	return unix.EpollCtl(s.epfd, op, fd, &ev)
}

func (s *sysPoller) add(fd int, token uint64) error {
	return s.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLET, token)
}

func (s *sysPoller) del(fd int) { _ = unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, fd, nil) }

// wait blocks until events arrive and appends them; closed once wake
// was called (the eventfd stays readable, so every waiter sees it). Waiters
// take turns on the runtime poller (one waits in it at a time, the others
// queue on the file's read lock as parked goroutines).
func (s *sysPoller) wait(b *waitBuf, evs []event) ([]event, bool) {
	for {
		n, err := s.epollWait(b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return evs, true // the epoll descriptor is unusable: nothing more will come
		}
		for i := range n {
			t := getToken(&b.events[i])
			if t == wakeToken {
				return evs[:0], true
			}
			evs = append(evs, event{token: t, hangup: b.events[i].Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0})
		}
		if len(evs) > 0 {
			return evs, false
		}
	}
}

// epollWait returns at least one event, or an error.
func (s *sysPoller) epollWait(b *waitBuf) (int, error) {
	if s.blocking {
		return unix.EpollWait(s.epfd, b.events[:], -1)
	}
	if b.take == nil {
		b.take = func(uintptr) bool {
			b.n, b.err = epollWaitNow(s.epfd, b.events[:])
			if b.err != nil && !errors.Is(b.err, unix.EINTR) {
				return true
			}
			return b.n > 0 // none yet: park until the runtime sees the descriptor readable
		}
	}
	if err := s.rc.Read(b.take); err != nil {
		return 0, err
	}
	return b.n, b.err
}

func (s *sysPoller) wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(s.evfd, one[:])
}

func (s *sysPoller) close() error {
	return errors.Join(unix.Close(s.evfd), s.file.Close())
}

// epollWaitNow is epoll_wait with no timeout, as a raw system call (see
// readFD); epoll_pwait with no signal mask, which every Linux architecture
// has (arm64 has no epoll_wait).
func epollWaitNow(epfd int, events []unix.EpollEvent) (int, error) {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		default:
			return 0, errno
		}
	}
}

// readFD reads a non-blocking descriptor. A raw system call, without the
// runtime's entersyscall: it never waits, and entersyscall wakes the
// runtime's monitor thread (sysmon) whenever it sleeps, which it does
// whenever the broker idles: a context switch or two per event of an idle
// device (perf: 3.5% of the broker's CPU in entersyscallWakeSysmon, ~20% in
// sysmon's sleeps and wake-ups).
func readFD(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		r, _, errno := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		n, err := int(r), error(nil)
		if errno != 0 {
			n, err = 0, errno
		}
		switch {
		case err == nil && n == 0 && len(b) > 0:
			return 0, errEOF
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, ErrWouldBlock
		default:
			return 0, err
		}
	}
}
