package bundle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// OpenRef opens a bundle a command names: an OCI layout (LAYOUT or
// LAYOUT@sha256:…), or a bundle directory with bundle.json, which is packed
// into a temporary layout under tmp. cleanup removes that layout; it is
// never nil.
func OpenRef(ctx context.Context, ref, tmp string) (b *Bundle, cleanup func(), err error) {
	nop := func() {}
	layout, err := CheckRef(ref)
	if err != nil {
		return nil, nop, err
	}
	if layout {
		b, err := Open(ref, DefaultLimits())
		return b, nop, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, nop, err
	}
	dir, err := os.MkdirTemp(tmp, "bundle-")
	if err != nil {
		return nil, nop, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	b, err = Pack(ctx, ref, dir, DefaultLimits())
	return b, cleanup, err
}

// CheckRef reports whether ref names an OCI layout (else a bundle
// directory), or why it names neither, without reading either.
func CheckRef(ref string) (layout bool, err error) {
	layoutDir, _, _ := strings.Cut(ref, "@")
	if _, err := os.Stat(filepath.Join(layoutDir, "oci-layout")); err == nil {
		return true, nil
	}
	if _, err := os.Stat(filepath.Join(ref, "bundle.json")); err != nil {
		return false, fmt.Errorf("neither an OCI layout nor a directory with bundle.json")
	}
	return false, nil
}
