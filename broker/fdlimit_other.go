//go:build !unix

package broker

func openFilesLimit() int64 { return 0 }
