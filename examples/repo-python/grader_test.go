package repopython

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGraderUnitTests runs the unit tests of this example's grader
// (grader-tests: patch.py on real git diffs, tree.py, grade.py's prepare
// on the bundle's own candidates) with the host's python3: no engine, no
// image. The tests live outside bundle/, which is what a sandbox sees.
func TestGraderUnitTests(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and there is no python3: %v", err)
		}
		t.Skip("no python3")
	}
	// go test keeps a result until a file the test opened changes; it never
	// sees python3's reads, so the test reads what python3 will.
	for _, dir := range []string{"bundle/grader", "grader-tests", "candidates", "bundle/repo", "bundle/instance.json"} {
		readTree(t, dir)
	}
	cmd := exec.Command(py, "-B", "-m", "unittest", "discover", "-s", "grader-tests", "-v")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1") // no __pycache__ in the bundle
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Log(strings.Join(lines[max(0, len(lines)-3):], " "))
}

func readTree(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		_, err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
