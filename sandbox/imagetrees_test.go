package sandbox

import (
	"slices"
	"strings"
	"testing"
)

func TestParseImageTrees(t *testing.T) {
	got, err := ParseImageTrees(`["/usr/local/go","/usr/local/share/gocache"]`)
	if err != nil || !slices.Equal(got, []string{"/usr/local/go", "/usr/local/share/gocache"}) {
		t.Fatalf("%v, %v", got, err)
	}
	for label, want := range map[string]string{
		`/usr/local/go`:            "not a JSON list",
		`["usr/local/go"]`:         "not a clean absolute directory",
		`["/usr/local/go/"]`:       "not a clean absolute directory",
		`["/usr/../etc"]`:          "not a clean absolute directory",
		`["/"]`:                    "not a clean absolute directory",
		`["/work/cache"]`:          "overlaps /work",
		`["/inputs"]`:              "overlaps /inputs",
		`["/.sandboxd"]`:           "overlaps /.sandboxd",
		`["/.code-tmp/x"]`:         "overlaps /.code-tmp",
		`["/bundle/x"]`:            "overlaps /bundle",
		`["/usr","/usr/local/go"]`: `"/usr" and "/usr/local/go" overlap`,
		`["/opt/a","/opt/a"]`:      "overlap",
		`["/tmp/go"]`:              "overlaps /tmp",
	} {
		if _, err := ParseImageTrees(label); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", label, err, want)
		}
	}
	// A tree may hold the mount points' parent only if it is not one of
	// theirs: "/" is refused above; a sibling is fine.
	if _, err := ParseImageTrees(`["/workshop"]`); err != nil {
		t.Errorf("/workshop: %v", err)
	}
}
