package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// goRuntime is one look inside a Go broker through its net/http/pprof
// endpoints (-broker-pprof): the heap in use after a forced GC, goroutine
// stacks in use, and the goroutine count. mosquitto has none of these.
type goRuntime struct {
	HeapInuseKB  int64 `json:"heap_inuse_kb"`
	StackInuseKB int64 `json:"stack_inuse_kb"`
	Goroutines   int   `json:"goroutines"`
}

var pprofClient = &http.Client{Timeout: 30 * time.Second}

// readGoRuntime reads base/heap?debug=1&gc=1 and base/goroutine?debug=1
// (base: ".../debug/pprof"). It forces a GC in the broker: read RSS first.
func readGoRuntime(base string) (*goRuntime, error) {
	if base == "" {
		return nil, nil
	}
	g := &goRuntime{}
	body, err := pprofGet(base + "/heap?debug=1&gc=1")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			g.HeapInuseKB = n >> 10
		}
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok { // "inuse / sys"
			f, _, _ := strings.Cut(v, " ")
			n, _ := strconv.ParseInt(f, 10, 64)
			g.StackInuseKB = n >> 10
		}
	}
	body, err = pprofGet(base + "/goroutine?debug=1")
	if err != nil {
		return nil, err
	}
	first, _, _ := strings.Cut(body, "\n")
	g.Goroutines, err = strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		return nil, fmt.Errorf("goroutine profile: %q", first)
	}
	return g, nil
}

func pprofGet(url string) (string, error) {
	resp, err := pprofClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// perUnit is what n units (connections, sessions) cost a Go broker, from
// readings before and after.
type perUnit struct {
	Before *goRuntime `json:"before"`
	After  *goRuntime `json:"after"`
	// HeapKB and StackKB per unit, goroutines per unit.
	HeapKB     float64 `json:"heap_kb"`
	StackKB    float64 `json:"stack_kb"`
	Goroutines float64 `json:"goroutines"`
}

func newPerUnit(before, after *goRuntime, n int) *perUnit {
	if before == nil || after == nil || n <= 0 {
		return nil
	}
	return &perUnit{Before: before, After: after,
		HeapKB:     round3(float64(after.HeapInuseKB-before.HeapInuseKB) / float64(n)),
		StackKB:    round3(float64(after.StackInuseKB-before.StackInuseKB) / float64(n)),
		Goroutines: round3(float64(after.Goroutines-before.Goroutines) / float64(n)),
	}
}
