package main

// A strict reader and applier of unified diffs as `git diff` writes them:
// the same rules as examples/repo-python/bundle/grader/patch.py, tested on
// the same fixtures (testdata/patches, examples/repo-python/grader-tests).
// No fuzz (a hunk may sit at other lines than its header says, never with
// other context); paths a/PATH and b/PATH, relative and clean (no quote,
// backslash or control character: git quotes such names), each file once;
// an empty file created or deleted is a git header without a hunk, as git
// writes it; renames, copies, mode changes and binary patches refused; text
// outside a file's diff (a commit message, format-patch's diffstat and "-- "
// signature) ignored. The candidate wrote the text: whatever is wrong with
// it is a refusal naming it.

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// maxFiles is the most files a patch (or a tree) may change.
const maxFiles = 200

// refused is why a patch is not applied, for the report.
type refused struct{ msg string }

func (r *refused) Error() string { return r.msg }

func refuse(format string, a ...any) error { return &refused{fmt.Sprintf(format, a...)} }

type hunkLine struct {
	tag  byte // ' ', '-' or '+'
	text string
}

type hunk struct {
	oldStart int
	lines    []hunkLine
}

type filePatch struct {
	old, new string // "" for /dev/null
	hunks    []hunk
}

func (f *filePatch) path() string {
	if f.new != "" {
		return f.new
	}
	return f.old
}

// hunkHeader takes line numbers and counts of at most 9 digits (no file
// here has more lines), as patch.py does.
var hunkHeader = regexp.MustCompile(`^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@`)

var (
	gitOK      = []string{"index ", "new file mode 100644", "deleted file mode 100644"}
	gitRefused = []string{"old mode", "new mode", "new file mode", "deleted file mode", "rename ", "copy ",
		"similarity index", "dissimilarity index", "GIT binary patch", "Binary files"}
)

func hasPrefix(s string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func patchPath(field string, where int) (string, error) {
	name, _, _ := strings.Cut(field, "\t")
	if name == "/dev/null" {
		return "", nil
	}
	if strings.HasPrefix(name, `"`) {
		return "", refuse("line %d: quoted path %s (a name git had to escape)", where, name)
	}
	first, rest, ok := strings.Cut(name, "/")
	if !ok || (first != "a" && first != "b") {
		return "", refuse("line %d: path %q is not a/PATH or b/PATH", where, name)
	}
	if quotable(rest) {
		return "", refuse("line %d: path %q holds a quote, a backslash or a control character"+
			" (a CR: the patch was saved with CRLF line ends)", where, name)
	}
	for _, p := range strings.Split(rest, "/") {
		if p == "" || p == "." || p == ".." {
			return "", refuse("line %d: path %q is not relative and clean", where, name)
		}
	}
	return rest, nil
}

// quotable reports whether git would quote the name: a quote, a backslash
// or a control character in it.
func quotable(name string) bool {
	return strings.ContainsFunc(name, func(r rune) bool { return r == '"' || r == '\\' || r < 0x20 || r == 0x7f })
}

// gitPath is the path of "diff --git a/P b/P" (no rename: both halves name P).
func gitPath(line string, where int) (string, error) {
	rest := strings.TrimPrefix(line, "diff --git ")
	half := (len(rest) - 1) / 2
	if len(rest)%2 == 0 || rest[half] != ' ' {
		return "", refuse("line %d: a git header without a diff, whose path cannot be read: %.80q", where, line)
	}
	old, err := patchPath(rest[:half], where)
	if err != nil {
		return "", err
	}
	nw, err := patchPath(rest[half+1:], where)
	if err != nil {
		return "", err
	}
	if old != nw {
		return "", refuse("line %d: %s becomes %s: renames are not taken", where, old, nw)
	}
	return old, nil
}

// parsePatch returns the file patches of a unified diff, in order.
func parsePatch(text string) ([]*filePatch, error) {
	lines := strings.Split(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	var files []*filePatch
	seen := map[string]bool{}
	add := func(fp *filePatch, at int) error {
		if seen[fp.path()] {
			return refuse("line %d: %s is patched twice", at+1, fp.path())
		}
		seen[fp.path()] = true
		files = append(files, fp)
		if len(files) > maxFiles {
			return refuse("more than %d files", maxFiles)
		}
		return nil
	}
	for i := 0; i < len(lines); {
		line := lines[i]
		if strings.HasPrefix(line, "diff --git ") {
			start, mode := i, ""
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "--- ") && !strings.HasPrefix(lines[i], "diff --git "); i++ {
				switch h := lines[i]; {
				case hasPrefix(h, gitOK):
					if strings.Contains(h, "file mode") {
						mode = strings.Fields(h)[0]
					}
				case hasPrefix(h, gitRefused):
					return nil, refuse("line %d: %s ...: only changes to the text of files are taken", i+1, strings.Fields(h)[0])
				default:
					return nil, refuse("line %d: unexpected line in a git header: %.80q", i+1, h)
				}
			}
			if i < len(lines) && strings.HasPrefix(lines[i], "--- ") {
				continue
			}
			// No "---": git writes an empty file created or deleted so.
			if mode == "" {
				return nil, refuse("line %d: a git header without a diff of a file created or deleted", start+1)
			}
			p, err := gitPath(line, start+1)
			if err != nil {
				return nil, err
			}
			fp := &filePatch{old: p}
			if mode == "new" {
				fp = &filePatch{new: p}
			}
			if err := add(fp, start); err != nil {
				return nil, err
			}
			continue
		}
		if !strings.HasPrefix(line, "--- ") {
			i++ // text outside a file's diff
			continue
		}
		fp, next, err := parseFile(lines, i)
		if err != nil {
			return nil, err
		}
		if err := add(fp, i); err != nil {
			return nil, err
		}
		i = next
	}
	if len(files) == 0 && strings.TrimSpace(text) != "" {
		return nil, refuse("the patch holds no file diff")
	}
	return files, nil
}

func parseFile(lines []string, i int) (*filePatch, int, error) {
	if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "+++ ") {
		return nil, 0, refuse("line %d: '---' without '+++' after it", i+1)
	}
	old, err := patchPath(lines[i][4:], i+1)
	if err != nil {
		return nil, 0, err
	}
	nw, err := patchPath(lines[i+1][4:], i+2)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case old == "" && nw == "":
		return nil, 0, refuse("line %d: /dev/null on both sides", i+1)
	case old != "" && nw != "" && old != nw:
		return nil, 0, refuse("line %d: %s becomes %s: renames are not taken", i+1, old, nw)
	}
	fp := &filePatch{old: old, new: nw}
	j := i + 2
	for j < len(lines) && strings.HasPrefix(lines[j], "@@") {
		if j, err = parseHunk(lines, j, fp); err != nil {
			return nil, 0, err
		}
	}
	if len(fp.hunks) == 0 {
		return nil, 0, refuse("line %d: %s has no hunk", j+1, fp.path())
	}
	// "-- " after the last hunk is format-patch's signature, not a line of it.
	if j < len(lines) && lines[j] != "" && strings.ContainsRune("+- \\", rune(lines[j][0])) && !strings.HasPrefix(lines[j], "--- ") && lines[j] != "-- " {
		return nil, 0, refuse("line %d: a line of a hunk beyond the count its header gives", j+1)
	}
	return fp, j, nil
}

func parseHunk(lines []string, i int, fp *filePatch) (int, error) {
	m := hunkHeader.FindStringSubmatch(lines[i])
	if m == nil {
		return 0, refuse("line %d: malformed hunk header %.80q", i+1, lines[i])
	}
	num := func(s string) int {
		if s == "" {
			return 1
		}
		n, _ := strconv.Atoi(s)
		return n
	}
	oldStart, oldN, newN := num(m[1]), num(m[2]), num(m[4])
	h := hunk{oldStart: oldStart}
	j := i + 1
	for oldN > 0 || newN > 0 {
		if j >= len(lines) {
			return 0, refuse("line %d: the hunk ends early", i+1)
		}
		s := lines[j]
		tag, rest := byte(' '), ""
		if s != "" { // an empty line: empty context, as some editors leave it
			tag, rest = s[0], s[1:]
		}
		switch tag {
		case ' ':
			oldN--
			newN--
		case '-':
			oldN--
		case '+':
			newN--
		default:
			return 0, refuse("line %d: %.80q is not a line of the hunk at line %d", j+1, s, i+1)
		}
		if oldN < 0 || newN < 0 {
			return 0, refuse("line %d: the hunk has more lines than its header says", i+1)
		}
		h.lines = append(h.lines, hunkLine{tag, rest + "\n"})
		j++
		if j < len(lines) && strings.HasPrefix(lines[j], "\\") { // "\ No newline at end of file"
			h.lines[len(h.lines)-1].text = rest
			j++
		}
	}
	if fp.old == "" && oldStart != 0 {
		return 0, refuse("line %d: a new file's hunk starts at line %d", i+1, oldStart)
	}
	fp.hunks = append(fp.hunks, h)
	return j, nil
}

// splitLines splits s after each "\n", as the patch is split.
func splitLines(s string) []string {
	parts := strings.SplitAfter(s, "\n")
	if len(parts) > 0 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	return parts
}

func equalAt(old, want []string, at int) bool {
	for k, w := range want {
		if old[at+k] != w {
			return false
		}
	}
	return true
}

// find is where want occurs in old at or after lowest, nearest to hint.
func find(old, want []string, hint, lowest int) int {
	last := len(old) - len(want)
	for d := 0; hint-d >= lowest || hint+d <= last; d++ {
		for _, at := range []int{hint - d, hint + d} {
			if at >= lowest && at <= last && equalAt(old, want, at) {
				return at
			}
		}
	}
	return -1
}

func patched(fp *filePatch, content string) (string, error) {
	old := splitLines(content)
	var out []string
	pos := 0
	for k, h := range fp.hunks {
		var want, repl []string
		for _, l := range h.lines {
			if l.tag != '+' {
				want = append(want, l.text)
			}
			if l.tag != '-' {
				repl = append(repl, l.text)
			}
		}
		hint := h.oldStart - 1
		if len(want) == 0 { // "-N,0" inserts after line N
			hint = h.oldStart
		}
		at := find(old, want, max(hint, 0), pos)
		if at < 0 {
			return "", refuse("does not apply: %s: hunk %d (line %d): its context and removed lines are not in the file", fp.path(), k+1, h.oldStart)
		}
		out = append(append(out, old[pos:at]...), repl...)
		pos = at + len(want)
	}
	return strings.Join(append(out, old[pos:]...), ""), nil
}

// applyPatch applies every file patch to the tree at root; nothing is
// written unless every one applies.
func applyPatch(files []*filePatch, root string) error {
	results := make([]string, len(files))
	for k, fp := range files {
		full := filepath.Join(root, fp.path())
		fi, err := os.Lstat(full)
		// No file: a path below a file, or a directory (one created here
		// takes the place of a directory the patch empties).
		exists := err == nil && !fi.IsDir()
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return refuse("does not apply: %s: %v", fp.path(), err)
		}
		if exists && !fi.Mode().IsRegular() {
			return refuse("does not apply: %s: not a regular file of the repository", fp.path())
		}
		switch {
		case fp.old == "" && exists:
			return refuse("does not apply: %s: created by the patch, but the repository has it", fp.path())
		case fp.old != "" && !exists:
			return refuse("does not apply: %s: not in the repository", fp.path())
		}
		var content []byte
		if exists {
			if content, err = os.ReadFile(full); err != nil {
				return refuse("does not apply: %s: %v", fp.path(), err)
			}
		}
		if results[k], err = patched(fp, string(content)); err != nil {
			return err
		}
		if fp.new == "" && results[k] != "" {
			return refuse("does not apply: %s: deleted, but the patch leaves lines in it", fp.path())
		}
	}
	// Removals first: a file may take a removed directory's place, or the reverse.
	for _, fp := range files {
		if fp.new == "" {
			if err := removeFile(root, fp.path()); err != nil {
				return refuse("does not apply: %v", err)
			}
		}
	}
	for k, fp := range files {
		if fp.new == "" {
			continue
		}
		if err := writeFile(root, fp.path(), []byte(results[k])); err != nil {
			return refuse("does not apply: %v", err)
		}
	}
	return nil
}

// removeFile removes a file and then the directories that removing it
// left empty, as git apply does.
func removeFile(root, p string) error {
	if err := os.Remove(filepath.Join(root, p)); err != nil {
		return err
	}
	for d := path.Dir(p); d != "."; d = path.Dir(d) {
		ents, err := os.ReadDir(filepath.Join(root, d))
		if err != nil || len(ents) > 0 {
			return err
		}
		if err := os.Remove(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes a file of the repository, mode 0644, with its directories.
func writeFile(root, p string, data []byte) error {
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	return os.WriteFile(full, data, 0o644)
}
