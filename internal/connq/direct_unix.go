//go:build unix

package connq

import (
	"errors"
	"syscall"
)

type rawWriter = syscall.RawConn

// writeNonblock writes what the socket takes of p with one write(2) that
// never waits; errWouldBlock when it takes nothing.
func writeNonblock(rc syscall.RawConn, p []byte) (int, error) {
	var n int
	var werr error
	err := rc.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), p)
			if !errors.Is(werr, syscall.EINTR) {
				break
			}
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
