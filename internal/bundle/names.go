package bundle

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// checkName applies the name rules to a path relative to a tree's root (no
// leading "./", no trailing "/"): valid UTF-8, no control characters, not
// absolute, clean, never leaving the tree, and within the length and depth
// ceilings. Each violation has its own sentinel.
func checkName(name string, lim TreeLimits) error {
	if !utf8.ValidString(name) {
		return fmt.Errorf("%q: %w", name, ErrInvalidUTF8)
	}
	for _, r := range name {
		// C0 (NUL and newline included), DEL and C1 controls.
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return fmt.Errorf("%q: %w", name, ErrControlChar)
		}
	}
	if len(name) > lim.MaxPathBytes {
		return fmt.Errorf("%.64q… (%d bytes, at most %d): %w", name, len(name), lim.MaxPathBytes, ErrPathTooLong)
	}
	if strings.HasPrefix(name, "/") {
		return fmt.Errorf("%q: %w", name, ErrAbsolutePath)
	}
	if name == "" || name == "." {
		return fmt.Errorf("%q: empty name: %w", name, ErrUncleanPath)
	}
	parts := strings.Split(name, "/")
	for _, p := range parts {
		if p == ".." {
			return fmt.Errorf("%q: %w", name, ErrPathEscapes)
		}
	}
	if path.Clean(name) != name {
		return fmt.Errorf("%q: %w", name, ErrUncleanPath)
	}
	if len(parts) > lim.MaxDepth {
		return fmt.Errorf("%q: %d components (at most %d): %w", name, len(parts), lim.MaxDepth, ErrTooDeep)
	}
	for _, p := range parts {
		if len(p) > maxComponentBytes {
			return fmt.Errorf("%.64q…: a component of %d bytes (at most %d): %w", name, len(p), maxComponentBytes, ErrPathTooLong)
		}
	}
	return nil
}

// parent returns the parent directory of a checked name, or "" at the top.
func parent(name string) string {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return ""
}
