// Package filter matches MQTT topic names against topic filters, for the
// parts of Keyline that match outside mochi's topic index (the cluster's
// queued messages, bridges' inbound rules). It allocates nothing.
package filter

import "strings"

// Match reports whether an MQTT topic filter matches a topic name: '+'
// is one level, a final '#' the parent level and any below it, and a
// wildcard first level never matches a topic starting with '$' (MQTT 5
// 4.7.2).
func Match(filter, topic string) bool {
	if topic != "" && topic[0] == '$' && filter != "" && (filter[0] == '+' || filter[0] == '#') {
		return false
	}
	for {
		f, frest, fmore := strings.Cut(filter, "/")
		if f == "#" && !fmore {
			return true
		}
		t, trest, tmore := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		switch {
		case !fmore && !tmore:
			return true
		case !tmore:
			return frest == "#" // "a/#" matches "a"
		case !fmore:
			return false
		}
		filter, topic = frest, trest
	}
}
