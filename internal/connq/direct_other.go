//go:build !unix

package connq

import "syscall"

type rawWriter = syscall.RawConn

func writeNonblock(syscall.RawConn, []byte) (int, error) { return 0, errWouldBlock }
