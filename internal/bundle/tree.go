package bundle

import (
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// entry is one accepted member of a tree, before it is written.
type entry struct {
	name string
	dir  bool
	exec bool
	size int64
	// content writes exactly size bytes of a regular file, or fails (with
	// ErrChanged if the source no longer matches what was accepted).
	content func(w io.Writer) error
}

// writeTree sorts entries and writes them in the canonical form.
func writeTree(w io.Writer, entries []entry) (Summary, error) {
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	tw := newTarWriter(w)
	for i := range entries {
		e := &entries[i]
		var err error
		if e.dir {
			err = tw.dir(e.name)
		} else {
			err = tw.file(e.name, e.exec, e.size, e.content)
		}
		if err != nil {
			return Summary{}, err
		}
	}
	return tw.close()
}

// nodeKind is what a name is in a tree being read, for symlink resolution.
type nodeKind int

const (
	nodeMissing nodeKind = iota
	nodeDir
	nodeFile
	nodeSymlink
	nodeOther
)

// lookupFunc reports what name (a clean path without symlinks in its
// directories) is; for a symlink it also returns the link's target.
type lookupFunc func(name string) (kind nodeKind, target string, err error)

// maxSymlinkHops is the longest symlink chain followed (Linux's MAXSYMLINKS).
const maxSymlinkHops = 40

// resolveSymlink follows the symlink at link (whose target is target)
// lexically, one component at a time, inside the tree: an absolute target
// or a ".." above the root anywhere in the chain is ErrSymlinkEscapes. It
// returns the path of the regular file the chain ends at; a chain ending at
// a directory, at nothing or at anything else is ErrSymlink, because the
// canonical form keeps a symlink only as a copy of the file it names.
func resolveSymlink(link, target string, lookup lookupFunc) (string, error) {
	cur := splitPath(parent(link))
	if path.IsAbs(target) {
		return "", fmt.Errorf("%q -> %q: %w", link, target, ErrSymlinkEscapes)
	}
	todo := splitPath(target)
	hops := 1
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "", fmt.Errorf("%q -> %q: %w", link, target, ErrSymlinkEscapes)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := strings.Join(append(slices.Clone(cur), c), "/")
		kind, t, err := lookup(p)
		if err != nil {
			return "", err
		}
		switch kind {
		case nodeSymlink:
			hops++
			if hops > maxSymlinkHops {
				return "", fmt.Errorf("%q: more than %d symlinks in a chain: %w", link, maxSymlinkHops, ErrSymlink)
			}
			if path.IsAbs(t) {
				return "", fmt.Errorf("%q -> … %q -> %q: %w", link, p, t, ErrSymlinkEscapes)
			}
			todo = append(splitPath(t), todo...)
		case nodeDir:
			cur = append(cur, c)
		case nodeFile:
			if slices.ContainsFunc(todo, func(s string) bool { return s != "." }) {
				return "", fmt.Errorf("%q -> %q: %q is not a directory: %w", link, target, p, ErrSymlink)
			}
			return p, nil
		case nodeMissing:
			return "", fmt.Errorf("%q -> %q: %q does not exist: %w", link, target, p, ErrSymlink)
		default:
			return "", fmt.Errorf("%q -> %q: %q is not a regular file: %w", link, target, p, ErrSymlink)
		}
	}
	return "", fmt.Errorf("%q -> %q: names a directory (only links to regular files are kept, as copies): %w", link, target, ErrSymlink)
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}
