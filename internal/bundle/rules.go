package bundle

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Workspace rules. A bundle may name workspace paths it refuses, as glob
// patterns (path.Match syntax). A pattern without a slash is matched
// against the last element of every path ("conftest.py" refuses a
// conftest.py in any directory, "*.pth" every .pth file); a pattern with a
// slash is matched against the whole relative path ("tests/*.py"). Both
// files and directories are matched, and a path under a refused directory
// is refused too (see RefusedBy). The rules are applied when a workspace
// is ingested for the bundle, to the workspace an evaluation is given, and
// to the export a candidate job leaves; the first path refused is named
// in the error (ErrRefusedPath).

// WorkspaceRules are the workspace rules of a bundle.
type WorkspaceRules struct {
	// Refuse lists the glob patterns of paths the bundle refuses.
	Refuse []string `json:"refuse"`
}

// ErrRefusedPath is a workspace path a bundle's rules refuse.
var ErrRefusedPath = newRefusal("path refused by the bundle's workspace rules")

const (
	maxRefusePatterns = 256
	maxPatternBytes   = 1024
)

func (r *WorkspaceRules) validate() error {
	if len(r.Refuse) == 0 {
		return manifestErr("workspace.refuse", "empty (leave workspace out instead)")
	}
	if len(r.Refuse) > maxRefusePatterns {
		return manifestErr("workspace.refuse", "%d patterns (at most %d)", len(r.Refuse), maxRefusePatterns)
	}
	for i, p := range r.Refuse {
		f := fmt.Sprintf("workspace.refuse[%d]", i)
		if p == "" || len(p) > maxPatternBytes || hasControl(p) {
			return manifestErr(f, "%q is empty, longer than %d bytes or has control characters", p, maxPatternBytes)
		}
		if strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
			return manifestErr(f, "%q is not a clean relative pattern", p)
		}
		if _, err := path.Match(p, ""); err != nil {
			return manifestErr(f, "%q: %v", p, err)
		}
	}
	return nil
}

// RefusedBy returns the first pattern of refuse that refuses name (a clean
// relative path), or "". A pattern refuses name if it matches name or one
// of its directories: a pattern without a slash is matched against each
// element of name, one with a slash against name and each of its parent
// paths. So a refused name refuses everything under it, whether or not the
// directory itself is an entry of the workspace.
func RefusedBy(refuse []string, name string) string {
	elems := strings.Split(name, "/")
	for _, p := range refuse {
		slash := strings.Contains(p, "/")
		for i := range elems {
			subject := elems[i]
			if slash {
				subject = strings.Join(elems[:i+1], "/")
			}
			if ok, _ := path.Match(p, subject); ok {
				return p
			}
		}
	}
	return ""
}

// refuseEntries refuses the first entry a pattern matches.
func refuseEntries(entries []entry, refuse []string) error {
	if len(refuse) == 0 {
		return nil
	}
	for _, e := range entries {
		if p := RefusedBy(refuse, e.name); p != "" {
			return fmt.Errorf("%q (pattern %q): %w", e.name, p, ErrRefusedPath)
		}
	}
	return nil
}

// CheckRefused reads a canonical workspace tar (as a store holds it) and
// refuses it if a pattern of refuse matches one of its paths.
func CheckRefused(r io.Reader, refuse []string) error {
	if len(refuse) == 0 {
		return nil
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if p := RefusedBy(refuse, name); p != "" {
			return fmt.Errorf("%q (pattern %q): %w", name, p, ErrRefusedPath)
		}
	}
}

// Refused returns the manifest's refused patterns (nil without rules).
func (m *Manifest) Refused() []string {
	if m.Workspace == nil {
		return nil
	}
	return m.Workspace.Refuse
}
