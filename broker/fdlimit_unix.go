//go:build unix

package broker

import "syscall"

// openFilesLimit returns the process's open-files limit (RLIMIT_NOFILE,
// which Go raises to the hard limit at start), or 0 if it is unknown or
// unlimited.
func openFilesLimit() int64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == ^uint64(0) || r.Cur > 1<<40 {
		return 0
	}
	return int64(r.Cur)
}
