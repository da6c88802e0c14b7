package enum

import (
	"errors"
	"testing"
)

func TestNames(t *testing.T) {
	sentinel := errors.New("bad")
	n := Names{"a", "b", "c"}
	for i, name := range n {
		v, err := n.Parse("x", name, sentinel)
		if err != nil || v != uint8(i+1) || n.Name(v) != name {
			t.Errorf("Parse(%q) = %d, %v", name, v, err)
		}
	}
	_, err := n.Parse("mode", "d", sentinel)
	if !errors.Is(err, sentinel) || err.Error() != `mode "d" is not one of a, b or c` {
		t.Errorf("Parse(d) = %v", err)
	}
	if n.Name(0) != "" || n.Name(9) != "(9)" || (Names{"one"}).String() != "one" {
		t.Errorf("Name(0) = %q, Name(9) = %q", n.Name(0), n.Name(9))
	}
}
