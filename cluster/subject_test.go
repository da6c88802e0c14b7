package cluster

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
)

// mqttMatch is the MQTT matching rule, written independently of mochi:
// '+' one level, '#' the rest (and the parent), '$' topics not matched by a
// leading wildcard.
func mqttMatch(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	fl, tl := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, f := range fl {
		if f == "#" {
			return true
		}
		if i >= len(tl) {
			return false
		}
		if f != "+" && f != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}

func validTopic(t string) bool {
	return t != "" && utf8.ValidString(t) && !strings.ContainsAny(t, "+#\x00")
}

func validFilter(f string) bool {
	if f == "" || !utf8.ValidString(f) || strings.ContainsRune(f, 0) {
		return false
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if l == "#" && i != len(levels)-1 {
			return false
		}
		if l != "#" && l != "+" && strings.ContainsAny(l, "+#") {
			return false
		}
	}
	return true
}

// checkTopic checks the properties of one topic's subject.
func checkTopic(t *testing.T, kind, topic string) string {
	t.Helper()
	s, hashed := TopicSubject(kind, topic)
	if !strings.HasPrefix(s, Prefix+"."+kind+".") {
		t.Fatalf("topic %q: subject %q is not under %s.%s.", topic, s, Prefix, kind)
	}
	if len(s) > MaxSubjectLen {
		t.Fatalf("topic %q: subject of %d bytes", topic, len(s))
	}
	if !ValidSubject(s, false) || !server.IsValidLiteralSubject(s) {
		t.Fatalf("topic %q: %q is not a valid literal subject", topic, s)
	}
	if hashed {
		if s != Prefix+"."+kind+".h."+TopicHash(topic) {
			t.Fatalf("topic %q: hashed subject %q", topic, s)
		}
		return s
	}
	k, back, ok := DecodeSubject(s)
	if !ok || k != kind || back != topic {
		t.Fatalf("topic %q: subject %q decodes to %q %q %v", topic, s, k, back, ok)
	}
	return s
}

// checkPair checks that the subjects of filter f take every message of
// topic that f matches, and (for short topics and filters) nothing else.
func checkPair(t *testing.T, f, topic string) {
	t.Helper()
	subs, err := FilterSubjects(KindMessage, f)
	if err != nil {
		t.Fatalf("filter %q: %v", f, err)
	}
	wide := false
	for _, s := range subs {
		if !strings.HasPrefix(s, Prefix+"."+KindMessage+".") || !ValidSubject(s, true) || !server.IsValidSubject(s) {
			t.Fatalf("filter %q: invalid subscription subject %q", f, s)
		}
		if s == Prefix+".m.t.>" || s == Prefix+".m.s.>" {
			wide = f != "#" // the literal part was too long to spell out
		}
	}
	ts, hashed := TopicSubject(KindMessage, topic)
	got := false
	for _, s := range subs {
		if server.SubjectMatchesFilter(ts, s) {
			got = true
		}
	}
	want := mqttMatch(f, topic)
	if want && !got {
		t.Fatalf("filter %q matches topic %q but none of %q takes %q", f, topic, subs, ts)
	}
	if got && !want && !hashed && !wide {
		t.Fatalf("filter %q does not match topic %q but %q takes %q", f, topic, subs, ts)
	}
}

func TestTopicSubjects(t *testing.T) {
	for _, c := range []struct{ topic, subject string }{
		{"a/b", "kl.m.t.a.b"},
		{"/a", "kl.m.t.~.a"},
		{"a/", "kl.m.t.a.~"},
		{"a//b", "kl.m.t.a.~.b"},
		{"/", "kl.m.t.~.~"},
		{"spBv1.0/plant", "kl.m.t.spBv1~2E0.plant"},
		{"a b/*/>", "kl.m.t.a~20b.~2A.~3E"},
		{"$SYS/x", "kl.m.s.~24SYS.x"},
		{"$JS/API/x", "kl.m.s.~24JS.API.x"},
		{"~", "kl.m.t.~7E"},
		{"ü", "kl.m.t.~C3~BC"},
	} {
		if s, _ := TopicSubject(KindMessage, c.topic); s != c.subject {
			t.Errorf("TopicSubject(%q) = %q, want %q", c.topic, s, c.subject)
		}
		checkTopic(t, KindMessage, c.topic)
	}
	long := strings.Repeat("x", 2000)
	if s, hashed := TopicSubject(KindQueued, long); !hashed || s != "kl.q.h."+TopicHash(long) {
		t.Errorf("long topic: %q %v", s, hashed)
	}
	// A level of 400 dots is 1,200 bytes encoded: hashed, although the topic is short.
	if _, hashed := TopicSubject(KindQueued, strings.Repeat(".", 400)); !hashed {
		t.Error("topic that encodes past MaxSubjectLen not hashed")
	}
}

func TestFilterSubjects(t *testing.T) {
	for _, c := range []struct {
		filter string
		want   []string
	}{
		{"a/b", []string{"kl.m.t.a.b"}},
		{"a/+/c", []string{"kl.m.t.a.*.c", "kl.m.h.*"}},
		{"a/#", []string{"kl.m.t.a", "kl.m.t.a.>", "kl.m.h.*"}},
		{"#", []string{"kl.m.t.>", "kl.m.h.*"}},
		{"+", []string{"kl.m.t.*", "kl.m.h.*"}},
		{"$SYS/#", []string{"kl.m.s.~24SYS", "kl.m.s.~24SYS.>", "kl.m.h.*"}},
		{"a.b/+", []string{"kl.m.t.a~2Eb.*", "kl.m.h.*"}},
	} {
		got, err := FilterSubjects(KindMessage, c.filter)
		if err != nil || strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("FilterSubjects(%q) = %q, %v; want %q", c.filter, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "a/#/b", "a+/b", "a/b#"} {
		if _, err := FilterSubjects(KindMessage, bad); err == nil {
			t.Errorf("FilterSubjects(%q) accepted", bad)
		}
	}
	topics := []string{"a", "a/b", "a/b/c", "/a", "a/", "/", "//", "$SYS/x", "$x", "a.b/c", "a b", "*", ">", "a/*/c", strings.Repeat("y/", 600)}
	filters := []string{"#", "+", "a/#", "a/+", "+/b", "/#", "+/+", "$SYS/#", "$x", "a.b/+", "*", ">", "a/*/c", "+/#", "a/b/c"}
	for _, f := range filters {
		for _, tp := range topics {
			checkPair(t, f, tp)
		}
	}
}

func TestNoCollisions(t *testing.T) {
	// Every topic over a small alphabet of troublesome bytes, up to 5 bytes.
	alpha := []byte{'a', '.', '/', '~', '$', ' ', '*', '>', '2', 'E'}
	seen := map[string]string{}
	var walk func(prefix []byte)
	walk = func(prefix []byte) {
		if len(prefix) > 0 && validTopic(string(prefix)) {
			topic := string(prefix)
			s := checkTopic(t, KindRetained, topic)
			if other, dup := seen[s]; dup {
				t.Fatalf("topics %q and %q share subject %q", other, topic, s)
			}
			seen[s] = topic
		}
		if len(prefix) == 5 {
			return
		}
		for _, c := range alpha {
			walk(append(prefix, c))
		}
	}
	walk(nil)
	if len(seen) < 100000 {
		t.Fatalf("only %d topics checked", len(seen))
	}
}

func FuzzTopicSubject(f *testing.F) {
	for _, s := range [][2]string{{"a/b", "a/#"}, {"$SYS/x", "#"}, {"a.b/ c", "+/ c"}, {"/", "+/+"}, {"~7E", "~7E"}, {"a//b", "a/+/b"}} {
		f.Add(s[0], s[1], s[0]+"x")
	}
	f.Fuzz(func(t *testing.T, topic, filter, other string) {
		if !validTopic(topic) {
			return
		}
		s := checkTopic(t, KindQueued, topic)
		if validTopic(other) && other != topic {
			if o, _ := TopicSubject(KindQueued, other); o == s {
				t.Fatalf("topics %q and %q share subject %q", topic, other, s)
			}
		}
		if validFilter(filter) {
			checkPair(t, filter, topic)
		}
		// The topic as a filter (no wildcards) takes exactly itself.
		checkPair(t, topic, topic)
	})
}
