package image

import (
	"archive/tar"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// addGoBuild builds the main package in the directory c.Src with the
// host's toolchain, static (no cgo) and without this machine's paths or
// version control state in it, so the same toolchain and sources give the
// same bytes, and places the binary at dst (mode 0755 unless c.Mode says
// otherwise).
func addGoBuild(c Content, dst string, add func(*entry) error) error {
	tmp, err := os.MkdirTemp("", "sandboxd-gobuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "bin")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, ".")
	cmd.Dir = c.Src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOTOOLCHAIN=local", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gobuild %s: %w\n%s", c.Src, err, tail(out))
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("gobuild %s: %w", c.Src, err)
	}
	return add(&entry{name: dst, typ: tar.TypeReg, mode: c.mode(0o755), text: b})
}
