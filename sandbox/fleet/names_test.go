package fleet

import (
	"strings"
	"testing"
)

// Host and tenant names are 1-63 bytes of the grammar: the longest is
// taken, one byte more is not.
func TestNamesBoundTheirLength(t *testing.T) {
	for _, check := range []func(string) error{CheckHostName, CheckTenantName} {
		if err := check("h" + strings.Repeat("x", 62)); err != nil {
			t.Errorf("a name of 63 bytes: %v", err)
		}
		for _, bad := range []string{"h" + strings.Repeat("x", 63), "", "-h", "h.x", "h x"} {
			if check(bad) == nil {
				t.Errorf("name %q taken", bad)
			}
		}
	}
}
