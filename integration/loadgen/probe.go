package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

// probeResult is what `loadgen probe` prints: the costs on this machine, at
// this moment, that bound the durable and the syscall-heavy cases, so that a
// report can set the brokers' figures beside them.
type probeResult struct {
	Scenario string   `json:"scenario"` // "probe"
	Label    string   `json:"label,omitempty"`
	Tag      string   `json:"tag,omitempty"`
	Round    int      `json:"round,omitempty"`
	OK       bool     `json:"ok"`
	Errors   []string `json:"errors,omitempty"`
	// SyscallNS is the median cost of one getppid(2) in nanoseconds: what
	// the kernel (and a hypervisor under it) charges for a system call.
	SyscallNS float64 `json:"syscall_ns"`
	// Fdatasync is the latency of one write of WriteBytes at the end of the
	// data written so far in a pre-zeroed file, then fdatasync(2), as the
	// segment log commits.
	Fdatasync  latencyJSON `json:"fdatasync_us"`
	WriteBytes int         `json:"write_bytes"`
	// Inflight and FsyncBound: a publisher with Inflight messages in flight
	// whose every message waits for one such commit gets at most
	// Inflight / median latency messages per second.
	Inflight   int     `json:"inflight"`
	FsyncBound float64 `json:"fsync_bound_per_s"`
}

// cmdProbe measures the cost of a system call and the latency of a small
// write + fdatasync in -dir (give it the directory the brokers write to).
func cmdProbe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", os.TempDir(), "directory on the disk to measure (a file is created there and removed)")
	n := fs.Int("n", 200, "fdatasyncs to time")
	size := fs.Int("size", 2048, "bytes written before each fdatasync")
	inflight := fs.Int("inflight", 20, "in-flight window the fsync bound is computed for")
	label := fs.String("label", "machine", "label echoed in the JSON")
	tag := fs.String("tag", "probe", "tag echoed in the JSON")
	round := fs.Int("round", 0, "round echoed in the JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *n < 1 || *n > 100_000 || *size < 1 || *size > 1<<20 || *inflight < 1 {
		fmt.Fprintln(stderr, "loadgen probe: -n must be 1..100000, -size 1..1048576, -inflight at least 1")
		return 2
	}
	res := probeResult{Scenario: "probe", Label: *label, Tag: *tag, Round: *round, WriteBytes: *size, Inflight: *inflight}
	res.SyscallNS = syscallCost()
	lat, err := fdatasyncLatency(*dir, *n, *size)
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
	} else {
		var h hist
		for _, d := range lat {
			h.record(d.Nanoseconds())
		}
		res.Fdatasync = h.summary()
		if p50 := res.Fdatasync.P50; p50 > 0 {
			res.FsyncBound = round3(float64(*inflight) / (p50 / 1e6))
		}
	}
	res.OK = len(res.Errors) == 0
	b, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(b))
	if !res.OK {
		fmt.Fprintln(stderr, "loadgen probe:", res.Errors[0])
		return 1
	}
	return 0
}

// syscallCost returns the median nanoseconds of one getppid over batches
// of 1,000 calls (the median drops batches a preemption landed in).
func syscallCost() float64 {
	const batches, per = 101, 1000
	v := make([]float64, batches)
	for i := range v {
		t := time.Now()
		for range per {
			syscall.Getppid()
		}
		v[i] = float64(time.Since(t).Nanoseconds()) / per
	}
	sort.Float64s(v)
	return round3(v[batches/2])
}

// fdatasyncLatency times n rounds of (write size bytes after the previous
// ones, fdatasync) in a file of dir that is zero-filled and synced first,
// the way the segment log prepares its segments.
func fdatasyncLatency(dir string, n, size int) ([]time.Duration, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "loadgen-probe-*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	total := int64(n) * int64(size)
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < total; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), total-off)], off); err != nil {
			return nil, fmt.Errorf("probe: zero-fill %s: %w", filepath.Base(f.Name()), err)
		}
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	lat := make([]time.Duration, n)
	for i := range n {
		t := time.Now()
		if _, err := f.WriteAt(buf, int64(i)*int64(size)); err != nil {
			return nil, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		lat[i] = time.Since(t)
	}
	return lat, nil
}
