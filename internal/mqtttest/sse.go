package mqtttest

import (
	"bufio"
	"io"
	"strings"
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
