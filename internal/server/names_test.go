package server

import (
	"strings"
	"testing"
)

// NATS names are 1-64 bytes of [A-Za-z0-9_-]: the longest is taken, one
// byte more is not.
func TestNATSNamesBoundTheirLength(t *testing.T) {
	if err := CheckNATSName(strings.Repeat("n", 64)); err != nil {
		t.Errorf("a name of 64 bytes: %v", err)
	}
	for _, bad := range []string{strings.Repeat("n", 65), "", "a.b", "a b"} {
		if CheckNATSName(bad) == nil {
			t.Errorf("name %q taken", bad)
		}
	}
}
