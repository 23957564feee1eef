package helper

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Without openat2 (gVisor), output directories are opened one component
// at a time: a link anywhere in the path is refused, as openat2 refuses it.
func TestOpenDirByComponentsRefusesLinks(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "work", "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "work"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "work", "out"), filepath.Join(root, "work", "outlink")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{filepath.Join(root, "work", "out"), true},
		{filepath.Join(root, "link", "out"), false},     // a link in the middle
		{filepath.Join(root, "work", "outlink"), false}, // a link at the end
		{filepath.Join(root, "work", "missing"), false}, // not there
		{"work/out", false},                             // relative
	} {
		fd, err := openDirByComponents(tc.path)
		if fd >= 0 {
			unix.Close(fd)
		}
		if (err == nil) != tc.ok {
			t.Errorf("openDirByComponents(%s): err %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
}
