package broker

import (
	"strings"
	"testing"
)

// A broker's name and volume prefix are at most 64 bytes of their grammar.
func TestVolumePrefixBoundsItsLength(t *testing.T) {
	if !validVolumePrefix("p" + strings.Repeat("x", 63)) {
		t.Error("a prefix of 64 bytes refused")
	}
	for _, bad := range []string{"p" + strings.Repeat("x", 64), "", "-p", "p/x", "p x"} {
		if validVolumePrefix(bad) {
			t.Errorf("prefix %q taken", bad)
		}
	}
}
