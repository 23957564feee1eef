// Command grader grades a repository instance (SWE-bench style) with go
// test, as the grader's uid: the same steps as examples/repo-python's
// grade.py. It reads the candidate, a unified diff (candidate.patch) or the
// whole repository tree (repo/), whichever is the one entry of its
// workspace, and refuses it before anything runs if it is malformed,
// touches a trusted path or a refused name (any *_test.go, go.mod, …), adds
// a line naming the test framework, or does not apply (a tree: tree.go,
// refused as the patch of the same change would be); applies it to a copy
// of the repository at its base; restores every trusted path; runs go test
// -json, whose test binaries run as the code uid through the helper's exec
// service (exec.sh); and writes the JUnit report itself, in a directory the
// code uid cannot write, with each FAIL_TO_PASS and PASS_TO_PASS test
// passed only if go test's events say so exactly once and its exit code
// agrees. A refusal, a skip, a test not run, a build that fails: a failure
// with its reason. Exits 0 only if every listed test passed.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type instance struct {
	InstanceID  string   `json:"instance_id"`
	Repo        string   `json:"repo"`
	PatchFile   string   `json:"patch_file"`
	TreeDir     string   `json:"tree_dir"`
	Trusted     []string `json:"trusted"`
	RefuseNames []string `json:"refuse_names"`
	RefuseAdded []string `json:"refuse_added"`
	TimeoutS    int      `json:"test_timeout_s"`
	FailToPass  []string `json:"FAIL_TO_PASS"`
	PassToPass  []string `json:"PASS_TO_PASS"`
}

const maxPatch = 4 << 20

// repoDir is where the grader makes the repository the tests run in (a
// variable for the unit tests).
var repoDir = "/work/repo"

type outcome struct {
	passed bool
	why    string
}

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "grader:", err)
		os.Exit(3)
	}
	var inst instance
	if err := json.Unmarshal(data, &inst); err != nil {
		fmt.Fprintln(os.Stderr, "grader: instance:", err)
		os.Exit(3)
	}
	if inst.PatchFile == "" || inst.TreeDir == "" {
		fmt.Fprintln(os.Stderr, "grader: instance: patch_file and tree_dir are required")
		os.Exit(3)
	}
	checks := append(append([]string{}, inst.FailToPass...), inst.PassToPass...)
	results := map[string]outcome{}
	if applied, err := prepare(&inst); err != nil {
		fmt.Fprintln(os.Stderr, "grader:", err)
		if r := (*refused)(nil); !errors.As(err, &r) {
			os.Exit(3) // the grader's own failure, not the candidate's
		}
		for _, c := range checks {
			results[c] = outcome{false, err.Error()}
		}
	} else {
		fmt.Fprintf(os.Stderr, "grader: %s: %s; trusted paths restored\n", inst.InstanceID, applied)
		code, events := runTests(&inst, checks)
		results = judge(checks, code, events)
	}
	if err := writeReport(&inst, results); err != nil {
		fmt.Fprintln(os.Stderr, "grader: report:", err)
		os.Exit(3)
	}
	for _, r := range results {
		if !r.passed {
			os.Exit(1)
		}
	}
}

// readCandidate says what the workspace holds: "patch" and the patch's
// file name, or "tree" and the tree's directory.
func readCandidate(inst *instance) (kind, name string, err error) {
	dir := os.Getenv("SANDBOXD_CANDIDATE")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", "", refuse("workspace refused: it cannot be read: %v", err)
	}
	var names, others []string
	has := map[string]bool{}
	for _, e := range ents {
		names = append(names, e.Name())
		has[e.Name()] = true
		if e.Name() != inst.PatchFile && e.Name() != inst.TreeDir {
			others = append(others, e.Name())
		}
	}
	switch {
	case has[inst.PatchFile] && has[inst.TreeDir]:
		return "", "", refuse("workspace refused: it holds both %s and %s/: give one", inst.PatchFile, inst.TreeDir)
	case !has[inst.PatchFile] && !has[inst.TreeDir]:
		held := strings.Join(names[:min(len(names), 5)], ", ")
		if held == "" {
			held = "nothing"
		}
		return "", "", refuse("workspace refused: it holds neither %s nor %s/ (it holds %s)", inst.PatchFile, inst.TreeDir, held)
	case len(others) > 0:
		shown := inst.PatchFile
		if has[inst.TreeDir] {
			shown = inst.TreeDir + "/"
		}
		return "", "", refuse("workspace refused: it holds other files than %s: %s", shown, strings.Join(others[:min(len(others), 5)], ", "))
	case has[inst.PatchFile]:
		return "patch", inst.PatchFile, nil
	}
	if fi, err := os.Lstat(filepath.Join(dir, inst.TreeDir)); err != nil || !fi.IsDir() {
		return "", "", refuse("workspace refused: %s is not a directory", inst.TreeDir)
	}
	return "tree", filepath.Join(dir, inst.TreeDir), nil
}

// readPatch is the patch's text, read without following a link, at most
// maxPatch bytes.
func readPatch(name string) (string, error) {
	f, err := os.OpenFile(filepath.Join(os.Getenv("SANDBOXD_CANDIDATE"), name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", refuse("%s: %v", name, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", refuse("%s is not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPatch+1))
	switch {
	case err != nil:
		return "", refuse("%s: %v", name, err)
	case len(b) > maxPatch:
		return "", refuse("%s is larger than %d bytes", name, maxPatch)
	case !utf8Valid(b):
		return "", refuse("%s is not UTF-8", name)
	}
	return string(b), nil
}

// checkPaths refuses a change touching a trusted path or a refused name.
func checkPaths(paths []string, inst *instance) error {
	for _, p := range paths {
		for _, t := range inst.Trusted {
			if p == t || strings.HasPrefix(p, t+"/") {
				return refuse("it touches %s, a trusted path (%s) restored from the bundle", p, t)
			}
		}
		for _, part := range strings.Split(p, "/") {
			for _, pat := range inst.RefuseNames {
				if ok, _ := path.Match(pat, part); ok {
					return refuse("it touches %s: %q (pattern %q) could change how the tests run", p, part, pat)
				}
			}
		}
	}
	return nil
}

// addedLine is a line a change adds to a file.
type addedLine struct{ path, text string }

// checkAdded refuses added lines naming the test framework (hygiene).
func checkAdded(added []addedLine, inst *instance) error {
	for _, l := range added {
		for _, w := range inst.RefuseAdded {
			if strings.Contains(l.text, w) {
				return refuse("%s: an added line names the test framework (%q): %.120q", l.path, w, strings.TrimSpace(l.text))
			}
		}
	}
	return nil
}

// patchChanges are a patch's files, the paths it touches and the lines it adds.
func patchChanges(text string) ([]*filePatch, []string, []addedLine, error) {
	files, err := parsePatch(text)
	if err != nil {
		return nil, nil, nil, err
	}
	var paths []string
	var added []addedLine
	for _, fp := range files {
		for _, p := range []string{fp.old, fp.new} {
			if p != "" {
				paths = append(paths, p)
			}
		}
		for _, h := range fp.hunks {
			for _, l := range h.lines {
				if l.tag == '+' {
					added = append(added, addedLine{fp.path(), l.text})
				}
			}
		}
	}
	return files, paths, added, nil
}

// treeChanges are a tree's changes, the paths they touch and the lines they add.
func treeChanges(base, tree string) ([]change, []string, []addedLine, error) {
	changes, err := diffTree(base, tree)
	if err != nil {
		return nil, nil, nil, err
	}
	var paths []string
	var added []addedLine
	for _, c := range changes {
		paths = append(paths, c.path)
		for _, l := range c.addedLines() {
			added = append(added, addedLine{c.path, l})
		}
	}
	return changes, paths, added, nil
}

// prepare makes the repository at its base with the candidate's change
// applied and every trusted path restored, and says what it applied. A
// refusal (*refused) says what was refused and why; another error is the
// grader's.
func prepare(inst *instance) (string, error) {
	kind, name, err := readCandidate(inst)
	if err != nil {
		return "", err
	}
	base := filepath.Join(os.Getenv("SANDBOXD_BUNDLE"), inst.Repo)
	n, err := applyCandidate(inst, kind, name, base)
	var r *refused
	if errors.As(err, &r) {
		return "", refuse("%s refused: %v", kind, r)
	}
	if err != nil {
		return "", err
	}
	for _, t := range inst.Trusted {
		dst := filepath.Join(repoDir, t)
		if err := os.RemoveAll(dst); err != nil {
			return "", err
		}
		src := filepath.Join(base, t)
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := copyPath(src, dst); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%s of %d changed file(s) applied", kind, n), nil
}

// applyCandidate checks the candidate's change and applies it to a copy of
// the base in repoDir; it returns the number of files changed.
func applyCandidate(inst *instance, kind, name, base string) (int, error) {
	var files []*filePatch
	var changes []change
	var paths []string
	var added []addedLine
	var err error
	if kind == "patch" {
		text, err := readPatch(name)
		if err != nil {
			return 0, err
		}
		files, paths, added, err = patchChanges(text)
		if err != nil {
			return 0, err
		}
	} else if changes, paths, added, err = treeChanges(base, name); err != nil {
		return 0, err
	}
	if err := checkPaths(paths, inst); err != nil {
		return 0, err
	}
	if err := checkAdded(added, inst); err != nil {
		return 0, err
	}
	if err := os.CopyFS(repoDir, os.DirFS(base)); err != nil {
		return 0, fmt.Errorf("copying the repository: %w", err)
	}
	if kind == "patch" {
		return len(files), applyPatch(files, repoDir)
	}
	if err := applyTree(changes, repoDir); err != nil {
		return 0, refuse("does not apply: %v", err)
	}
	return len(changes), nil
}

func copyPath(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.CopyFS(dst, os.DirFS(src))
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

type event struct {
	Action, Package, Test, Output string
}

// runTests runs go test -json over the repository; the test binaries run
// as the code uid (exec.sh). It returns go test's exit code (-1: it did
// not end in time) and its events.
func runTests(inst *instance, checks []string) (int, []event) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(inst.TimeoutS+60)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-json", "-count=1", fmt.Sprintf("-timeout=%ds", inst.TimeoutS),
		"-exec", "/bin/sh "+os.Getenv("SANDBOXD_BUNDLE")+"/grader/exec.sh", "./...")
	cmd.Dir, cmd.Stderr = repoDir, os.Stderr
	out, err := cmd.StdoutPipe() // go test's, as the grader: the code uid never holds it
	if err != nil {
		return -2, nil
	}
	if err := cmd.Start(); err != nil {
		return -2, nil
	}
	events := readEvents(out, checks)
	io.Copy(io.Discard, out) // what a read error left: go test must not block on a full pipe
	err = cmd.Wait()
	code := 0
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		code = -1
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		code = -2
	}
	return code, events
}

// Bounds on what is kept of go test's output: the tests print what the
// candidate's code makes them print, including lines test2json takes for
// its own ("=== RUN   TestAnyName"), and all of it kept in memory (it
// was) could take the grader's memory, a limit of its job (inconclusive).
const (
	maxEventLine  = 64 << 10 // a longer line is no event this grader reads
	maxTestOutput = 1000     // bytes of a check's output judge keeps
)

// readEvents reads go test -json's events from r as they come and keeps
// what judge reads, and no more: the events of the checks (a check's runs
// up to two, its output up to maxTestOutput bytes), and one "fail" for any
// other test or package that failed.
func readEvents(r io.Reader, checks []string) []event {
	isCheck := map[string]bool{}
	for _, c := range checks {
		isCheck[c] = true
	}
	br := bufio.NewReaderSize(r, maxEventLine)
	var events []event
	runs, kept, otherFailed := map[string]int{}, map[string]int{}, false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of that line
				_, err = br.ReadSlice('\n')
			}
			if err != nil {
				break
			}
			continue
		}
		var e event
		if json.Unmarshal(line, &e) == nil && e.Action != "" {
			name := e.Package + "." + e.Test
			switch {
			case !isCheck[name]:
				otherFailed = otherFailed || e.Action == "fail"
			case e.Action == "run":
				if runs[name]++; runs[name] <= 2 {
					events = append(events, e)
				}
			case e.Action == "output":
				if kept[name] < maxTestOutput {
					e.Output = e.Output[:min(len(e.Output), maxTestOutput-kept[name])]
					kept[name] += len(e.Output)
					events = append(events, e)
				}
			default:
				events = append(events, e)
			}
		}
		if err != nil {
			break
		}
	}
	if otherFailed {
		events = append(events, event{Action: "fail"})
	}
	return events
}

func judge(checks []string, code int, events []event) map[string]outcome {
	all := func(why string) map[string]outcome {
		r := map[string]outcome{}
		for _, c := range checks {
			r[c] = outcome{false, why}
		}
		return r
	}
	if code == -1 {
		return all("the tests did not end within the time limit")
	}
	runs, final, failed := map[string]int{}, map[string]string{}, false
	output := map[string]string{} // what a test printed: the reason it failed, for people
	for _, e := range events {
		name := e.Package + "." + e.Test
		switch e.Action {
		case "run":
			runs[name]++
		case "pass", "fail", "skip":
			final[name] = e.Action
		case "output":
			if o := strings.TrimSpace(e.Output); o != "" && !strings.HasPrefix(o, "=== ") && !strings.HasPrefix(o, "--- ") && len(output[name]) < maxTestOutput {
				output[name] += o + " "
			}
		}
		failed = failed || e.Action == "fail"
	}
	if (code == 0) == failed || (code != 0 && code != 1) {
		return all(fmt.Sprintf("go test's exit code %d disagrees with its events", code))
	}
	r := map[string]outcome{}
	for _, c := range checks {
		switch {
		case runs[c] != 1:
			r[c] = outcome{false, fmt.Sprintf("go test ran it %d times (exit code %d; a build failure runs none)", runs[c], code)}
		case final[c] == "pass":
			r[c] = outcome{true, ""}
		case final[c] == "skip":
			r[c] = outcome{false, strings.TrimSpace("skipped: " + output[c])}
		default:
			r[c] = outcome{false, strings.TrimSpace("failed: " + output[c])}
		}
	}
	return r
}

func writeReport(inst *instance, results map[string]outcome) error {
	kind := map[string]string{}
	for _, c := range inst.FailToPass {
		kind[c] = "FAIL_TO_PASS"
	}
	checks := append(append([]string{}, inst.FailToPass...), inst.PassToPass...)
	var b strings.Builder
	failures := 0
	for _, c := range checks {
		if !results[c].passed {
			failures++
		}
	}
	fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<testsuites><testsuite name=%s tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"0\">\n",
		attr(inst.InstanceID), len(checks), failures)
	for _, c := range checks {
		i := strings.LastIndex(c, ".")
		class, name := c[:max(i, 0)], c[i+1:]
		if results[c].passed {
			fmt.Fprintf(&b, "<testcase classname=%s name=%s/>\n", attr(class), attr(name))
			continue
		}
		k := kind[c]
		if k == "" {
			k = "PASS_TO_PASS"
		}
		why := k + ": " + results[c].why
		if len(why) > 2000 {
			why = why[:2000]
		}
		fmt.Fprintf(&b, "<testcase classname=%s name=%s><failure message=%s/></testcase>\n", attr(class), attr(name), attr(why))
	}
	b.WriteString("</testsuite></testsuites>\n")
	report := os.Getenv("SANDBOXD_REPORT")
	if err := os.MkdirAll(filepath.Dir(report), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(report+".tmp", []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(report+".tmp", report)
}
