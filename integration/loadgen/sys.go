package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clkTck is USER_HZ, the unit of /proc times (100 on every Linux we target).
const clkTck = 100

// cpuSnap is one reading of the CPU time used by this process, the broker
// and the whole machine.
type cpuSnap struct {
	wall        time.Time
	self        time.Duration // user+system of this process (getrusage)
	broker      time.Duration // user+system of the --broker-pid processes (0 if none)
	machineBusy time.Duration // all CPUs, non-idle, from /proc/stat
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns user+system time of pid from /proc/<pid>/stat.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clkTck
}

// machineBusy returns the non-idle CPU time of all CPUs from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, s := range f[1:] {
		v, _ := strconv.ParseInt(s, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // guest and guest_nice are already counted in user/nice
			break
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clkTck
}

func snapCPU(brokerPIDs []int) cpuSnap {
	var broker time.Duration
	for _, pid := range brokerPIDs {
		broker += procCPU(pid)
	}
	return cpuSnap{wall: time.Now(), self: selfCPU(), broker: broker, machineBusy: machineBusy()}
}

type cpuJSON struct {
	// Cores used on average over the measured window (1.0 = one core busy).
	Loadgen float64 `json:"loadgen_cores"`
	Broker  float64 `json:"broker_cores"`
	Machine float64 `json:"machine_busy_cores"`
	// Other processes on the machine (machine - loadgen - broker).
	Other float64 `json:"other_cores"`
	// Share of the machine's CPU (all cores) used by the load generator.
	LoadgenShare float64 `json:"loadgen_share"`
	NumCPU       int     `json:"ncpu"`
	// CPU microseconds per delivered message, for the load generator and the broker.
	LoadgenUsPerMsg float64 `json:"loadgen_us_per_msg,omitempty"`
	BrokerUsPerMsg  float64 `json:"broker_us_per_msg,omitempty"`
}

func cpuBetween(a, b cpuSnap, ncpu int, msgs uint64) cpuJSON {
	wall := b.wall.Sub(a.wall).Seconds()
	if wall <= 0 {
		return cpuJSON{NumCPU: ncpu}
	}
	c := cpuJSON{
		Loadgen: round3((b.self - a.self).Seconds() / wall),
		Broker:  round3((b.broker - a.broker).Seconds() / wall),
		Machine: round3((b.machineBusy - a.machineBusy).Seconds() / wall),
		NumCPU:  ncpu,
	}
	c.Other = round3(max(0, c.Machine-c.Loadgen-c.Broker))
	c.LoadgenShare = round3(c.Loadgen / float64(ncpu))
	if msgs > 0 {
		c.LoadgenUsPerMsg = round3((b.self - a.self).Seconds() * 1e6 / float64(msgs))
		c.BrokerUsPerMsg = round3((b.broker - a.broker).Seconds() * 1e6 / float64(msgs))
	}
	return c
}

// rssKB returns VmRSS of pid in KiB (0 if unknown).
func rssKB(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// procFDLimit returns the soft "Max open files" of pid (0 if unknown).
func procFDLimit(pid int) int {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(line)
			if len(f) >= 4 {
				n, _ := strconv.Atoi(f[3])
				return n
			}
		}
	}
	return 0
}

// raiseFDLimit raises this process's RLIMIT_NOFILE soft limit to its hard
// limit and returns the new soft limit.
func raiseFDLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 1024
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return int(l.Cur)
}

// rssSampler records the broker's RSS every interval until stopped.
type rssSampler struct {
	pid    int
	start  time.Time
	stop   chan struct{}
	done   chan struct{}
	series [][2]int64 // ms since start, KiB
}

func startRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{pid: pid, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if pid <= 0 {
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.series = append(s.series, [2]int64{time.Since(s.start).Milliseconds(), rssKB(pid)})
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

type rssJSON struct {
	StartKB int64      `json:"start_kb"`
	MaxKB   int64      `json:"max_kb"`
	EndKB   int64      `json:"end_kb"`
	Series  [][2]int64 `json:"series,omitempty"`
}

func (s *rssSampler) finish(keepSeries bool) *rssJSON {
	close(s.stop)
	<-s.done
	if len(s.series) == 0 {
		return nil
	}
	r := &rssJSON{StartKB: s.series[0][1], EndKB: s.series[len(s.series)-1][1]}
	for _, p := range s.series {
		r.MaxKB = max(r.MaxKB, p[1])
	}
	if keepSeries {
		r.Series = s.series
	}
	return r
}
