package image

import (
	"archive/tar"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// addGoBuild builds the main package in the directory c.Src with the
// host's toolchain, static (no cgo) and without this machine's paths,
// settings or version control state in it, so the same toolchain, sources
// and module give the same bytes, and places the binary at dst (mode 0755
// unless c.Mode says otherwise).
func addGoBuild(c Content, dst string, add func(*entry) error) error {
	tmp, err := os.MkdirTemp("", "sandboxd-gobuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "bin")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, ".")
	cmd.Dir = c.Src
	// Everything of the environment that would change the bytes is set
	// (the image is linux/amd64, as its config says); the rest (PATH, the
	// build and module caches) only makes the build faster.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOAMD64=v1",
		"GOEXPERIMENT=", "GODEBUG=", "GOFIPS140=off", "GOFLAGS=", "GOENV=off", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gobuild %s: %w\n%s", c.Src, err, tail(out))
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("gobuild %s: %w", c.Src, err)
	}
	return add(&entry{name: dst, typ: tar.TypeReg, mode: c.mode(0o755), text: b})
}

// moduleFile returns the go.mod of the module the directory dir is in (""
// if none): it is part of what a gobuild content is built from.
func moduleFile(dir string) string {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if p := filepath.Join(d, "go.mod"); fileExists(p) {
			return p
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
