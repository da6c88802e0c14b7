package broker

import (
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes that reads and prints with binary units:
// "65536", "64KiB", "8MiB", "1GiB" (KB/MB/GB mean the same powers of 1024).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"B", 1},
}

// ParseByteSize parses a size such as "512KiB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q (want a number of bytes, optionally with KiB, MiB or GiB)", s)
	}
	return ByteSize(n * mult), nil
}

func (b ByteSize) String() string {
	for _, u := range byteUnits[:3] {
		if b >= ByteSize(u.mult) && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// UnmarshalText lets YAML (and anything else that speaks encoding.TextUnmarshaler) read a ByteSize.
func (b *ByteSize) UnmarshalText(text []byte) error {
	v, err := ParseByteSize(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalText prints the size with its largest exact unit.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// Set and Type make *ByteSize a pflag.Value.
func (b *ByteSize) Set(s string) error { return b.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (b *ByteSize) Type() string { return "size" }
