//go:build linux

package netpoll

import (
	"errors"

	"golang.org/x/sys/unix"
)

// wakeToken is the eventfd's token: no connection has generation 0.
const wakeToken = 0

type sysPoller struct {
	epfd, evfd int
}

// waitBuf is one waiter's buffer for epoll_wait.
type waitBuf struct{ events [maxEvents]unix.EpollEvent }

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

// wait blocks until events arrive and appends their tokens; closed once wake
// was called (the eventfd stays readable, so every waiter sees it).
func (s *sysPoller) wait(b *waitBuf, tokens []uint64) ([]uint64, bool) {
	for {
		n, err := unix.EpollWait(s.epfd, b.events[:], -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return tokens, true // the epoll descriptor is unusable: nothing more will come
		}
		for i := range n {
			t := getToken(&b.events[i])
			if t == wakeToken {
				return tokens[:0], true
			}
			tokens = append(tokens, t)
		}
		if len(tokens) > 0 {
			return tokens, false
		}
	}
}

func (s *sysPoller) wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(s.evfd, one[:])
}

func (s *sysPoller) close() error {
	return errors.Join(unix.Close(s.evfd), unix.Close(s.epfd))
}

func readFD(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
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
