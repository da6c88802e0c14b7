package console

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// funcs are the template functions. Each returns plain strings: escaping is
// html/template's job, in the context where the value lands.
var funcs = template.FuncMap{
	"num":        num,
	"rate":       rate,
	"bytes":      byteSize,
	"dur":        duration,
	"ago":        ago,
	"ts":         timestamp,
	"iso":        func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"proto":      protocol,
	"groupURL":   func(name string) string { return "/groups/view?" + url.Values{"group": {name}}.Encode() },
	"dlqURL":     func(name string) string { return "/dlq?" + url.Values{"group": {name}}.Encode() },
	"clientURL":  func(id string) string { return "/clients/view?" + url.Values{"id": {id}}.Encode() },
	"letterURL":  letterURL,
	"confirmURL": confirmURL,
	"payload":    decodePayload,
	"preview":    preview,
	"add":        func(a, b int) int { return a + b },
}

// num prints an integer with thousands separators: 1234567 -> "1,234,567".
func num(v any) string {
	var s string
	switch n := v.(type) {
	case int:
		s = strconv.FormatInt(int64(n), 10)
	case int64:
		s = strconv.FormatInt(n, 10)
	case uint64:
		s = strconv.FormatUint(n, 10)
	case uint16:
		s = strconv.FormatUint(uint64(n), 10)
	case byte:
		s = strconv.FormatUint(uint64(n), 10)
	case float64:
		s = strconv.FormatInt(int64(math.Round(n)), 10)
	default:
		return fmt.Sprint(v)
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// rate prints a per-second rate: one decimal below 10, whole numbers above.
// static/console.js formats live values the same way.
func rate(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return num(v)
}

// byteSize prints a size in bytes with binary units: "512 B", "1.5 KiB".
func byteSize(v any) string {
	var n float64
	switch x := v.(type) {
	case int:
		n = float64(x)
	case int64:
		n = float64(x)
	case uint64:
		n = float64(x)
	case float64:
		n = x
	default:
		return fmt.Sprint(v)
	}
	if n < 1024 {
		return num(n) + " B"
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	i := -1
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return strconv.FormatFloat(n, 'f', 1, 64) + " " + units[i]
}

// duration prints seconds as the two largest units: "3d 4h", "12m 5s".
func duration(sec float64) string {
	s := int64(sec)
	d, h, m := s/86400, s%86400/3600, s%3600/60
	s %= 60
	switch {
	case d > 0:
		return fmt.Sprintf("%dd %dh", d, h)
	case h > 0:
		return fmt.Sprintf("%dh %dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm %ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}

// ago prints how long before now t was: "5s ago"; "never" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + duration(-d.Seconds())
	}
	return duration(d.Seconds()) + " ago"
}

// timestamp prints t in UTC to the second; "" for the zero time.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func protocol(v byte) string {
	switch v {
	case 3:
		return "3.1"
	case 4:
		return "3.1.1"
	case 5:
		return "5"
	}
	return strconv.Itoa(int(v))
}

func letterURL(group string, id uint64) string {
	return "/dlq/letter?" + url.Values{"group": {group}, "id": {strconv.FormatUint(id, 10)}}.Encode()
}

// confirmURL is the confirmation page of action; args are key, value pairs.
func confirmURL(action string, args ...any) string {
	q := url.Values{"action": {action}}
	for i := 0; i+1 < len(args); i += 2 {
		q.Set(fmt.Sprint(args[i]), fmt.Sprint(args[i+1]))
	}
	return "/confirm?" + q.Encode()
}

// shownPayload is a payload as a page shows it.
type shownPayload struct {
	Size int
	// Text is the payload as text, when it is UTF-8 that reads as text.
	Text   string
	IsText bool
	// Hex is a hex dump of the payload's first maxHexBytes.
	Hex       string
	HexCut    bool
	Malformed bool // the encoding did not decode
}

const maxHexBytes = 4096

// rawPayload decodes a payload as the API carries it (utf-8 or base64).
func rawPayload(payload, encoding string) ([]byte, bool) {
	if encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(payload)
		return b, err == nil
	}
	return []byte(payload), true
}

// decodePayload decodes a payload for a page: as text when it reads as text,
// and as a hex dump.
func decodePayload(payload, encoding string) shownPayload {
	b, ok := rawPayload(payload, encoding)
	if !ok {
		return shownPayload{Malformed: true}
	}
	p := shownPayload{Size: len(b)}
	if utf8.Valid(b) && readable(string(b)) {
		p.Text, p.IsText = string(b), true
	}
	if len(b) > maxHexBytes {
		b, p.HexCut = b[:maxHexBytes], true
	}
	p.Hex = hex.Dump(b)
	return p
}

// readable reports whether s is text a person can read: no control
// characters other than tab, newline and carriage return.
func readable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// preview is a one-line glimpse of a payload: up to n characters of text, or
// the first bytes in hex.
func preview(payload, encoding string, n int) string {
	b, ok := rawPayload(payload, encoding)
	if !ok {
		return "(undecodable)"
	}
	if utf8.Valid(b) && readable(string(b)) {
		s := strings.Join(strings.Fields(string(b)), " ")
		if r := []rune(s); len(r) > n {
			s = string(r[:n]) + "…"
		}
		return s
	}
	cut := ""
	if len(b) > n/3 {
		b, cut = b[:n/3], " …"
	}
	return "hex " + fmt.Sprintf("% x", b) + cut
}
