//go:build unix

package connq

import (
	"errors"
	"syscall"
	"unsafe"
)

type rawWriter = syscall.RawConn

// writeNonblock writes what the socket takes of p with one write(2) that
// never waits; errWouldBlock when it takes nothing. p is not empty.
func writeNonblock(rc syscall.RawConn, p []byte) (int, error) {
	var n int
	var werr error
	err := rc.Write(func(fd uintptr) bool {
		for {
			// A raw system call: see writevNow.
			r, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if errno == syscall.EINTR {
				continue
			}
			n, werr = int(r), nil
			if errno != 0 {
				n, werr = 0, errno
			}
			break
		}
		return true // never wait for writability: the writer goroutine does
	})
	if err != nil {
		return 0, err
	}
	if werr != nil {
		if errors.Is(werr, syscall.EAGAIN) {
			return 0, errWouldBlock
		}
		return 0, werr
	}
	return n, nil
}
