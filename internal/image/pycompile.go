package image

import (
	"archive/tar"
	"bytes"
	_ "embed"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// A "pycompile" content byte-compiles the Python sources already placed
// below Dst with the host interpreter Src, which must be exactly the
// image's Python version (Python), and places each .pyc where the image's
// interpreter looks for it (__pycache__/NAME.cpython-XY.pyc). The root
// file system of a sandbox is read-only, so without these every Python
// process would compile every module it imports again (`import pytest`:
// about a second here). The .pyc files are of the unchecked-hash kind:
// they name no source time (the sources in an image never change), so the
// same sources and interpreter give the same bytes.

//go:embed pycompile.py
var pycompileScript string

func addPyCompile(c Content, dst string, m map[string]*entry, add func(*entry) error) error {
	out, err := exec.Command(c.Src, "-c", "import platform; print(platform.python_version())").Output()
	if err != nil {
		return fmt.Errorf("pycompile: %s: %w", c.Src, err)
	}
	if got := strings.TrimSpace(string(out)); got != c.Python {
		return fmt.Errorf("pycompile: %s is Python %s, the image's is %s (install that version, or leave pycompile out)", c.Src, got, c.Python)
	}
	var sources []string
	for name, e := range m {
		if e.typ == tar.TypeReg && strings.HasSuffix(name, ".py") && (name == dst || strings.HasPrefix(name, dst+"/")) {
			sources = append(sources, name)
		}
	}
	sort.Strings(sources)
	tmp, err := os.MkdirTemp("", "sandboxd-pycompile-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	srcRoot, outRoot := filepath.Join(tmp, "src"), filepath.Join(tmp, "out")
	for _, name := range sources {
		p := filepath.Join(srcRoot, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := writeEntryFile(p, m[name]); err != nil {
			return err
		}
	}
	cmd := exec.Command(c.Src, "-I", "-c", pycompileScript, srcRoot, outRoot)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONHASHSEED=0", "SOURCE_DATE_EPOCH=0"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pycompile: %w\n%s", err, tail(out))
	}
	return filepath.WalkDir(outRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(outRoot, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return add(&entry{name: path.Clean(filepath.ToSlash(rel)), typ: tar.TypeReg, mode: 0o644, text: b})
	})
}

func writeEntryFile(p string, e *entry) error {
	if e.src != "" {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return err
		}
		return os.WriteFile(p, b, 0o644)
	}
	return os.WriteFile(p, bytes.Clone(e.text), 0o644)
}
