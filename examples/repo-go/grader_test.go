package repogo

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The grader is a module of its own (bundle/grader: built in the image at
// grade time, so go test at the root does not reach it); its unit tests
// run from here, with go vet, as go test ./... at the root runs them.
func TestGraderUnitTests(t *testing.T) {
	// go test keeps a result until a file the test opened changes; it never
	// sees the child go's reads, so the test reads what they will.
	for _, dir := range []string{"bundle/grader", "bundle/repo", "bundle/instance.json", "candidates"} {
		readTree(t, dir)
	}
	for _, args := range [][]string{{"vet", "./..."}, {"test", "-count=1", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Join("bundle", "grader")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %v in %s: %v\n%s", args, cmd.Dir, err, out)
		}
	}
}

// patch.go and patch.py take the same fixtures, written by one script
// (examples/repo-python/grader-tests/make-fixtures.sh) into both places.
func TestPatchFixturesAreRepoPythons(t *testing.T) {
	ours, theirs := readTree(t, "bundle/grader/testdata/patches"), readTree(t, "../repo-python/grader-tests/testdata/patches")
	if len(ours) < 20 {
		t.Fatalf("%d fixture files, want the whole set", len(ours))
	}
	for p, b := range ours {
		if tb, ok := theirs[p]; !ok || !bytes.Equal(b, tb) {
			t.Errorf("%s differs from examples/repo-python's (run make-fixtures.sh for both)", p)
		}
	}
	for p := range theirs {
		if _, ok := ours[p]; !ok {
			t.Errorf("%s: only in examples/repo-python's fixtures", p)
		}
	}
}

// readTree returns the regular files below root (or root itself) and their bytes.
func readTree(t *testing.T, root string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		files[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
