package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// warmRoot is a fixed host path for the warm-up module: compiler outputs
// embed the package directory, so a fixed path keeps the cache, and with it
// the image ID, reproducible.
const warmRoot = "/tmp/sandboxd-image-gocache"

// addGoCache warms a Go build cache by testing the module at c.Src with the
// host's toolchain under the image's environment, then places it at dst.
// Entry timestamps are zeroed and the trim marker dropped so that the same
// toolchain and module give the same bytes.
func addGoCache(spec *Spec, c Content, dst string, add func(*entry) error) error {
	if err := os.MkdirAll(filepath.Dir(warmRoot), 0o755); err != nil {
		return err
	}
	// /tmp is shared: the lock is never opened through a link, and the
	// warm-up directory is made anew, by us, private, or the build fails.
	lock, err := os.OpenFile(warmRoot+".lock", os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if err := os.RemoveAll(warmRoot); err != nil {
		return err
	}
	if err := os.Mkdir(warmRoot, 0o700); err != nil {
		return fmt.Errorf("gocache: %w", err)
	}
	defer os.RemoveAll(warmRoot)
	src, cache := filepath.Join(warmRoot, "src"), filepath.Join(warmRoot, "cache")
	if err := os.CopyFS(src, os.DirFS(c.Src)); err != nil {
		return fmt.Errorf("gocache: copy %s: %w", c.Src, err)
	}
	// TZ="" is UTC: the module index keys of the warm-up name file times
	// as UTC, as rekeyModuleIndex computes them.
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + warmRoot, "GOCACHE=" + cache, "GOPATH=" + filepath.Join(warmRoot, "gopath"), "GOTELEMETRY=off", "TZ="}
	for _, kv := range spec.Env {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command("go", "test", "-count=1", "-json", "./...")
	cmd.Dir, cmd.Env = src, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gocache: warm-up test in %s: %w\n%s", c.Src, err, tail(out))
	}
	// Index every standard package, not only those the warm-up loads (a
	// grader's may be others), for rekeyModuleIndex.
	cmd = exec.Command("go", "list", "-e", "std")
	cmd.Dir, cmd.Env = src, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gocache: go list std: %w\n%s", err, tail(out))
	}
	if err := rekeyModuleIndex(spec, env, cache); err != nil {
		return fmt.Errorf("gocache: %w", err)
	}
	var entries []*entry
	err = filepath.WalkDir(cache, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(cache, p)
		name := dst
		if rel != "." {
			name = path.Join(dst, filepath.ToSlash(rel))
		}
		switch {
		case d.IsDir():
			entries = append(entries, &entry{name: name, typ: tar.TypeDir, mode: 0o755})
		case rel == "trim.txt" || rel == "testexpire.txt":
		case strings.HasSuffix(rel, "-a"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entries = append(entries, &entry{name: name, typ: tar.TypeReg, mode: 0o644, text: zeroEntryTime(b)})
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entries = append(entries, &entry{name: name, typ: tar.TypeReg, mode: 0o644, text: b})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := add(e); err != nil {
			return err
		}
	}
	return nil
}

// zeroEntryTime rewrites the time field of a cache action entry
// ("v1 <action> <output> <size> <time>\n") to zero, keeping its width.
func zeroEntryTime(b []byte) []byte {
	line := bytes.TrimSuffix(b, []byte("\n"))
	i := bytes.LastIndexByte(line, ' ')
	if i < 0 || !bytes.HasPrefix(line, []byte("v1 ")) {
		return b
	}
	// The field is right-aligned in 20 columns ("%20d").
	j := i
	for j > 0 && line[j-1] == ' ' {
		j--
	}
	width := len(line) - j
	out := append([]byte{}, line[:j]...)
	out = append(out, fmt.Sprintf("%*d", width, 0)...)
	return append(out, '\n')
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
