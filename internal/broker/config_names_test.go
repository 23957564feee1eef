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

// The code uid is another non-root identity, in another group than the
// candidate's: that group may write /tmp (the helper's closeScratch), so a
// code uid in it could fill the grader's scratch space again.
func TestCodeIdentityIsItsOwn(t *testing.T) {
	ok := Default()
	ok.ShimPath = "/x"
	if err := ok.Validate(); err != nil {
		t.Fatalf("the default identities: %v", err)
	}
	for name, change := range map[string]func(*Config){
		"the candidate's uid":   func(c *Config) { c.CodeUID = c.CandidateUID },
		"the candidate's group": func(c *Config) { c.CodeGID = c.CandidateGID },
		"root's group":          func(c *Config) { c.CodeGID = 0 },
	} {
		c := ok
		change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "code uid/gid") {
			t.Errorf("%s: %v, want the code identity refused", name, err)
		}
	}
}
