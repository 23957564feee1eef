package main

// What a candidate's whole tree changes in the repository at its base: the
// same rules as examples/repo-python/bundle/grader/tree.py. A change is
// what a unified diff could say, and nothing else: the text of a file
// changed, a file added (mode 0644), a file removed. The tree is the
// candidate's, so whatever a patch could not say is refused, naming the
// path: a symlink, FIFO, socket or device; a file whose executable bit
// differs from the base's, or a new executable file (a mode change); a
// changed, added or removed file that is not UTF-8 text or holds a NUL byte
// (its diff would be binary); a name holding a quote, a backslash or a
// control character (git would quote it). Directories carry no change of
// their own: an empty one is ignored, as git ignores it. Bounds, checked
// while walking: at most maxEntries entries, at most maxFiles changed
// files, at most maxChangeBytes of changed and added content (a patch's
// own bound).

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"unicode/utf8"
)

var (
	maxEntries     = 100_000
	maxChangeBytes = int64(maxPatch)
)

// change is one file the tree changes: its text before (none if the tree
// adds it) and after (none if the tree removes it).
type change struct {
	path           string
	old, new       []byte
	added, removed bool
}

// addedLines are the lines every diff of the change adds: those the new
// text holds more often than the old.
func (c *change) addedLines() []string {
	if c.removed {
		return nil
	}
	counts := map[string]int{}
	for _, l := range splitLines(string(c.old)) {
		counts[l]++
	}
	var added []string
	for _, l := range splitLines(string(c.new)) {
		if counts[l] > 0 {
			counts[l]--
		} else {
			added = append(added, l)
		}
	}
	return added
}

// walkTree returns the regular files below root, walked in lexical order.
// With refuseOthers (the candidate's tree) a name git would quote or an
// entry that is neither a directory nor a regular file is refused.
func walkTree(root, what string, refuseOthers bool) (map[string]fs.FileInfo, error) {
	files, count := map[string]fs.FileInfo{}, 0
	err := filepath.WalkDir(root, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if full == root {
			return nil
		}
		if count++; count > maxEntries {
			return refuse("the %s holds more than %d entries", what, maxEntries)
		}
		p, err := filepath.Rel(root, full)
		if err != nil {
			return err
		}
		if refuseOthers {
			if !utf8.ValidString(p) {
				return refuse("%q: the name is not UTF-8", p)
			}
			if quotable(p) {
				return refuse("%q: the name holds a quote, a backslash or a control character (git would quote it)", p)
			}
		}
		switch t := d.Type(); {
		case t.IsDir():
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			files[p] = fi
		case refuseOthers:
			return refuse("%s is %s: only regular files and directories are taken", p, kind(t))
		}
		return nil
	})
	return files, err
}

func kind(t fs.FileMode) string {
	switch {
	case t&fs.ModeSymlink != 0:
		return "a symlink"
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

// readCandidateFile reads the file p of the tree without following a
// link, refusing it if it holds more than limit bytes.
func readCandidateFile(tree, p string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(filepath.Join(tree, p), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, refuse("%s: not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = refuse("the changed files hold more than %d bytes", maxChangeBytes)
	}
	return b, err
}

func sameFile(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil {
			return false, eb
		}
	}
}

func checkText(p string, data []byte) error {
	if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
		return refuse("%s: not UTF-8 text (its diff would be binary): only changes to the text of files are taken", p)
	}
	return nil
}

// diffTree returns the changes that make base's regular files tree's,
// sorted by path.
func diffTree(base, tree string) ([]change, error) {
	old, err := walkTree(base, "base", false)
	if err != nil {
		return nil, err
	}
	nw, err := walkTree(tree, "tree", true)
	if err != nil {
		return nil, err
	}
	var paths []string
	for p := range old {
		paths = append(paths, p)
	}
	for p := range nw {
		if old[p] == nil {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var changes []change
	budget := maxChangeBytes
	for _, p := range paths {
		o, n := old[p], nw[p]
		if n != nil {
			was := o != nil && o.Mode()&0o100 != 0
			if n.Mode()&0o100 != 0 != was {
				how := "its executable bit changes"
				if o == nil {
					how = "a new executable file"
				}
				return nil, refuse("%s: %s: only changes to the text of files are taken", p, how)
			}
			if o != nil && o.Size() == n.Size() {
				same, err := sameFile(filepath.Join(base, p), filepath.Join(tree, p))
				if err != nil {
					return nil, err
				}
				if same {
					continue
				}
			}
		}
		if len(changes) == maxFiles {
			return nil, refuse("more than %d changed files", maxFiles)
		}
		c := change{path: p, added: o == nil, removed: n == nil}
		if o != nil {
			if c.old, err = os.ReadFile(filepath.Join(base, p)); err != nil {
				return nil, err
			}
		}
		if n != nil {
			if c.new, err = readCandidateFile(tree, p, budget); err != nil {
				return nil, err
			}
			budget -= int64(len(c.new))
		}
		if err := checkText(p, c.old); err != nil {
			return nil, err
		}
		if err := checkText(p, c.new); err != nil {
			return nil, err
		}
		changes = append(changes, c)
	}
	return changes, nil
}

// applyTree writes the changes into root: removals first (a directory they
// empty goes, as with a patch: the tree may have a file in its place), then
// every file's new text.
func applyTree(changes []change, root string) error {
	for _, c := range changes {
		if c.removed {
			if err := removeFile(root, c.path); err != nil {
				return err
			}
		}
	}
	for _, c := range changes {
		if !c.removed {
			if err := writeFile(root, c.path, c.new); err != nil {
				return err
			}
		}
	}
	return nil
}
