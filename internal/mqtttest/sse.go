package mqtttest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// SSE is one server-sent event (the broker's topic stream).
type SSE struct{ Name, Data string }

// ReadSSE sends the events read from r on events until r ends; an event that
// finds events full is dropped (a test that stopped reading). It closes
// events when it returns.
func ReadSSE(r io.Reader, events chan<- SSE) {
	defer close(events)
	sc := bufio.NewScanner(r)
	var ev SSE
	for sc.Scan() {
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "event: "):
			ev.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = strings.TrimPrefix(line, "data: ")
		case line == "" && ev.Name != "":
			select {
			case events <- ev:
			default:
			}
			ev = SSE{}
		}
	}
}

// OpenSSE sends GET url with header's name, value pairs through client and
// returns the response and its events (buffered: capacity); the stream ends
// with the test.
func OpenSSE(t testing.TB, client *http.Client, url string, capacity int, header ...string) (*http.Response, <-chan SSE) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	events := make(chan SSE, capacity)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ReadSSE(resp.Body, events)
	}()
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
		<-done
	})
	return resp, events
}
