package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// What prepare says of each candidate of examples/repo-go/candidates
// (README's table; the verdicts of those it applies come from go test, in
// the script test).
var wantPrepare = map[string]string{
	"gold.patch":                         "patch of 1 changed file(s) applied",
	"wrong.patch":                        "patch of 1 changed file(s) applied",
	"does-not-build.patch":               "patch of 1 changed file(s) applied",
	"patches-the-runner-disguised.patch": "applied",
	"edits-the-tests.patch":              "patch refused: it touches cart/cart_test.go, a trusted path (cart/cart_test.go) restored from the bundle",
	"skips-tests.patch":                  "patch refused: it touches cart/cart_test.go, a trusted path",
	"adds-test-main.patch":               `patch refused: it touches pricing/main_test.go: "main_test.go" (pattern "*_test.go")`,
	"patches-the-runner.patch":           "patch refused: pricing/compat.go: an added line names the test framework",
	"does-not-apply.patch":               "patch refused: does not apply: pricing/discounts.go: hunk 1 (line 2)",
	"tree-gold":                          "tree of 1 changed file(s) applied",
	"tree-edits-the-tests":               "tree refused: it touches cart/cart_test.go, a trusted path (cart/cart_test.go) restored from the bundle",
}

const candidates = "../../candidates"

type prepareEnv struct {
	t      *testing.T
	inst   instance
	bundle string
	n      int
}

func newPrepareEnv(t *testing.T) *prepareEnv {
	bundle, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(bundle, "instance.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := &prepareEnv{t: t, bundle: bundle}
	if err := json.Unmarshal(b, &e.inst); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOXD_BUNDLE", bundle)
	old := repoDir
	t.Cleanup(func() { repoDir = old })
	return e
}

// prepare runs prepare on a new workspace that fill makes: what it says
// (refused or applied) and the repository it made ("" if refused).
func (e *prepareEnv) prepare(fill func(ws string)) (string, string) {
	e.t.Helper()
	tmp := e.t.TempDir()
	ws := filepath.Join(tmp, "ws")
	mkdir(e.t, ws, ".")
	fill(ws)
	e.t.Setenv("SANDBOXD_CANDIDATE", ws)
	repoDir = filepath.Join(tmp, "repo")
	got, err := prepare(&e.inst)
	if err != nil {
		if _, ok := err.(*refused); !ok {
			e.t.Fatalf("got %v (%T), want a refusal or nothing", err, err)
		}
		return err.Error(), ""
	}
	return got, repoDir
}

func (e *prepareEnv) candidate(name string) func(ws string) {
	src := filepath.Join(candidates, name)
	return func(ws string) {
		var err error
		if strings.HasSuffix(name, ".patch") {
			var b []byte
			if b, err = os.ReadFile(src); err == nil {
				err = os.WriteFile(filepath.Join(ws, "candidate.patch"), b, 0o644)
			}
		} else {
			err = os.CopyFS(filepath.Join(ws, "repo"), os.DirFS(filepath.Join(src, "repo")))
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

func TestPrepareEveryCandidate(t *testing.T) {
	e := newPrepareEnv(t)
	ents, err := os.ReadDir(candidates)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ent := range ents {
		names = append(names, ent.Name())
	}
	var want []string
	for name := range wantPrepare {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("candidates %q, want the table's %q", names, want)
	}
	for _, name := range names {
		if got, _ := e.prepare(e.candidate(name)); !strings.Contains(got, wantPrepare[name]) {
			t.Errorf("%s: got %q, want it to hold %q", name, got, wantPrepare[name])
		}
	}
}

func TestPrepareGoldTreeMakesWhatTheGoldPatchMakes(t *testing.T) {
	e := newPrepareEnv(t)
	_, byPatch := e.prepare(e.candidate("gold.patch"))
	_, byTree := e.prepare(e.candidate("tree-gold"))
	if d := diffSnapshots(snapshot(t, byTree), snapshot(t, byPatch)); d != "" {
		t.Error(d)
	}
	if d := diffSnapshots(snapshot(t, byTree), snapshot(t, filepath.Join(e.bundle, "repo"))); d == "" {
		t.Error("the gold tree made the base")
	}
}

// Every candidate patch that applies to the base, given as the tree it
// makes, is refused for the same reason or applied alike.
func TestPrepareTreeIsJudgedAsItsPatch(t *testing.T) {
	e := newPrepareEnv(t)
	for name, want := range wantPrepare {
		if !strings.HasSuffix(name, ".patch") || strings.Contains(want, "does not apply") {
			continue
		}
		text, err := os.ReadFile(filepath.Join(candidates, name))
		if err != nil {
			t.Fatal(err)
		}
		files, err := parsePatch(string(text))
		if err != nil {
			t.Fatal(err)
		}
		byPatch, repoP := e.prepare(e.candidate(name))
		byTree, repoT := e.prepare(func(ws string) {
			repo := filepath.Join(ws, "repo")
			if err := os.CopyFS(repo, os.DirFS(filepath.Join(e.bundle, "repo"))); err != nil {
				t.Fatal(err)
			}
			if err := applyPatch(files, repo); err != nil {
				t.Fatal(err)
			}
		})
		if got := strings.Replace(byTree, "tree ", "patch ", 1); got != byPatch {
			t.Errorf("%s: as a tree %q, as a patch %q", name, byTree, byPatch)
		}
		if repoP != "" {
			if d := diffSnapshots(snapshot(t, repoT), snapshot(t, repoP)); d != "" {
				t.Errorf("%s: %s", name, d)
			}
		}
	}
}

func TestPrepareTreeRefusals(t *testing.T) {
	e := newPrepareEnv(t)
	gold := e.candidate("tree-gold")
	for _, tc := range []struct {
		name string
		edit func(repo string)
		want string
	}{
		{"a symlink", func(repo string) { symlink(t, "/bundle/instance.json", repo, "pricing/rates.go") },
			"tree refused: pricing/rates.go is a symlink: only regular files and directories are taken"},
		{"a new test file", func(repo string) { writeTestFile(t, repo, "pricing/x_test.go", "package pricing\n", 0o644) },
			`tree refused: it touches pricing/x_test.go: "x_test.go" (pattern "*_test.go")`},
		{"a vendor directory", func(repo string) { writeTestFile(t, repo, "vendor/modules.txt", "\n", 0o644) },
			`tree refused: it touches vendor/modules.txt: "vendor" (pattern "vendor")`},
		{"a line naming the framework", func(repo string) {
			writeTestFile(t, repo, "pricing/compat.go", "package pricing\n\nimport \"testing\"\n\nvar _ = testing.Short\n", 0o644)
		}, `tree refused: pricing/compat.go: an added line names the test framework ("\"testing\"")`},
		{"an emptied go.mod", func(repo string) { writeTestFile(t, repo, "go.mod", "", 0o644) },
			"tree refused: it touches go.mod, a trusted path (go.mod)"},
		{"every file removed", func(repo string) {
			if err := os.RemoveAll(repo); err != nil {
				t.Fatal(err)
			}
			mkdir(t, repo, ".")
		}, "tree refused: it touches cart/cart_test.go, a trusted path"},
	} {
		got, _ := e.prepare(func(ws string) {
			gold(ws)
			tc.edit(filepath.Join(ws, "repo"))
		})
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want it to hold %q", tc.name, got, tc.want)
		}
	}
}

func TestPrepareWhatTheWorkspaceHolds(t *testing.T) {
	e := newPrepareEnv(t)
	patch, tree := e.candidate("gold.patch"), e.candidate("tree-gold")
	for _, tc := range []struct {
		fill func(ws string)
		want string
	}{
		{func(ws string) { patch(ws); tree(ws) }, "workspace refused: it holds both candidate.patch and repo/: give one"},
		{func(string) {}, "workspace refused: it holds neither candidate.patch nor repo/ (it holds nothing)"},
		{func(ws string) { writeTestFile(t, ws, "fix.diff", "", 0o644) }, "workspace refused: it holds neither candidate.patch nor repo/ (it holds fix.diff)"},
		{func(ws string) { patch(ws); writeTestFile(t, ws, "notes.txt", "", 0o644) }, "workspace refused: it holds other files than candidate.patch: notes.txt"},
		{func(ws string) { tree(ws); writeTestFile(t, ws, "notes.txt", "", 0o644) }, "workspace refused: it holds other files than repo/: notes.txt"},
		{func(ws string) { writeTestFile(t, ws, "repo", "a file\n", 0o644) }, "workspace refused: repo is not a directory"},
		{func(ws string) { symlink(t, "/", ws, "repo") }, "workspace refused: repo is not a directory"},
		{func(ws string) { mkdir(t, ws, "candidate.patch") }, "patch refused: candidate.patch is not a regular file"},
		{func(ws string) { writeTestFile(t, ws, "candidate.patch", "\xff\n", 0o644) }, "patch refused: candidate.patch is not UTF-8"},
	} {
		if got, _ := e.prepare(tc.fill); !strings.Contains(got, tc.want) {
			t.Errorf("got %q, want it to hold %q", got, tc.want)
		}
	}
}

func TestPrepareRestoresTrustedPaths(t *testing.T) {
	e := newPrepareEnv(t)
	_, repo := e.prepare(e.candidate("tree-gold"))
	for _, p := range e.inst.Trusted {
		want, err := os.ReadFile(filepath.Join(e.bundle, "repo", p))
		if os.IsNotExist(err) {
			continue // go.sum: the module has no dependency
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(repo, p))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not the bundle's", p)
		}
	}
}
