//go:build linux

package netpoll

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// epoll_event's data is 64 bits; x/sys names its halves Fd and Pad (and on
// some architectures puts padding before them).
func putToken(ev *unix.EpollEvent, t uint64) {
	*(*uint64)(unsafe.Pointer(&ev.Fd)) = t
}

func getToken(ev *unix.EpollEvent) uint64 {
	return *(*uint64)(unsafe.Pointer(&ev.Fd))
}
