package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// containerdClient is containerd's Go client: the module
// github.com/containerd/containerd (v1.7) and the packages below it, its
// api module among them. github.com/containerd/errdefs, the error classes
// every engine shares, is not part of it.
const containerdClient = "github.com/containerd/containerd"

// below reports whether the import path p is root or a package below it.
func below(root, p string) bool {
	return p == root || strings.HasPrefix(p, root+"/")
}

// neverContainerd are "never" edges (as neverEdges) to the containerd
// client, whose path lies outside this module: no package matching from
// depends on it, directly or through another package.
var neverContainerd = []edge{
	{"sandbox/...", containerdClient, "a verifier never links an engine"},
	{"internal/supervisor", containerdClient, "the judge never links an engine"},
	{"internal/receipt", containerdClient, "the signer never links an engine"},
	{"internal/bundle", containerdClient, "bundle checks never link an engine"},
	{"internal/evaluate", containerdClient, "what defines and judges an evaluation never links an engine"},
	{"internal/evidence", containerdClient, "re-judging evidence never links an engine"},
	{"internal/junitreport", containerdClient, "the JUnit writer never links an engine"},
	{"internal/broker/...", containerdClient, "the broker is engine-neutral: each engine translates its Engine calls"},
}

// foreignViolations is violations for edges whose to is an import path
// outside the module (to and the packages below it).
func foreignViolations(pkgs []pkg, edges []edge) []string {
	var out []string
	for _, e := range edges {
		matched := false
		for _, p := range pkgs {
			if !match(e.from, p.ImportPath) {
				continue
			}
			matched = true
			for _, d := range p.Deps {
				if below(e.to, d) {
					out = append(out, fmt.Sprintf("%s depends on %s: %s", p.ImportPath, d, e.why))
				}
			}
		}
		if !matched {
			out = append(out, fmt.Sprintf("no package matches %q (edge to %s): the package map is out of date", e.from, e.to))
		}
	}
	return out
}

// directOnly is a rule on direct imports: only the packages matching one
// of importers (patterns as in edge) may import target (an import path)
// or a package below it, in their code or in their tests. The packages of
// target's own tree are exempt.
type directOnly struct {
	target    string
	importers []string
	why       string
}

var directOnlyRules = []directOnly{
	{containerdClient, []string{"internal/containerdengine"},
		"only the containerd engine talks to containerd; everything else reaches it through the broker's Engine"},
	{module + "internal/containerdengine", []string{"cmd/sandboxd", "bench", "internal/testharness"},
		"the engine is chosen by wiring: the daemon's command, the benchmarks and the suites' harness"},
}

// imports is a package's direct imports, of its code and of its tests.
type imports struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// listImports is every package's direct imports, test-only packages (the
// engine suites) included.
func listImports(t *testing.T) []imports {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,Imports,TestImports,XTestImports",
		"github.com/sandboxd/sandboxd/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, errb.String())
	}
	var pkgs []imports
	for dec := json.NewDecoder(&out); dec.More(); {
		var p imports
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	// As listPackages does, so that a changed import (in a test file too)
	// runs these tests again rather than reusing a cached pass.
	for _, p := range pkgs {
		if _, err := os.ReadDir(p.Dir); err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.TestGoFiles, p.XTestGoFiles) {
			if _, err := os.Stat(filepath.Join(p.Dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return pkgs
}

// directViolations returns every import that breaks a rule, every
// importer pattern that matches no package, and every rule that no
// package's imports reach (it would check nothing).
func directViolations(pkgs []imports, rules []directOnly) []string {
	var out []string
	for _, r := range rules {
		live := false
		for _, pattern := range r.importers {
			if !slices.ContainsFunc(pkgs, func(p imports) bool { return match(pattern, p.ImportPath) }) {
				out = append(out, fmt.Sprintf("no package matches %q (importer of %s): the package map is out of date", pattern, r.target))
			}
		}
		for _, p := range pkgs {
			allowed := below(r.target, p.ImportPath) ||
				slices.ContainsFunc(r.importers, func(pattern string) bool { return match(pattern, p.ImportPath) })
			for _, list := range []struct {
				where   string
				imports []string
			}{{"", p.Imports}, {" in its tests", slices.Concat(p.TestImports, p.XTestImports)}} {
				for _, i := range list.imports {
					if !below(r.target, i) || below(r.target, p.ImportPath) {
						continue
					}
					live = true
					if !allowed {
						out = append(out, fmt.Sprintf("%s imports %s%s: %s", p.ImportPath, i, list.where, r.why))
					}
				}
			}
		}
		if !live {
			out = append(out, fmt.Sprintf("no package imports %s: the rule checks nothing", r.target))
		}
	}
	return out
}

// Nothing that judges, attests, checks inputs or runs a job links the
// containerd client, transitively; and the edge is not vacuous: the
// engine's own dependencies do reach it.
func TestNeverContainerd(t *testing.T) {
	pkgs := listPackages(t)
	for _, v := range foreignViolations(pkgs, neverContainerd) {
		t.Error(v)
	}
	i := slices.IndexFunc(pkgs, func(p pkg) bool { return p.ImportPath == module+"internal/containerdengine" })
	if i < 0 || !slices.ContainsFunc(pkgs[i].Deps, func(d string) bool { return below(containerdClient, d) }) {
		t.Errorf("internal/containerdengine is missing or does not depend on %s: the edges to it check nothing", containerdClient)
	}
}

// Only the containerd engine imports the containerd client, and only the
// wiring imports the engine, in code or tests.
func TestDirectImportsOfTheContainerdEngine(t *testing.T) {
	for _, v := range directViolations(listImports(t), directOnlyRules) {
		t.Error(v)
	}
}

// The checks themselves catch a violation: a direct or transitive
// dependency on the client, an import in a test file or a test-only
// package, and rules about packages that no longer exist; and they leave
// alone what is not the client (its error classes, a look-alike path).
func TestContainerdChecksCatchViolations(t *testing.T) {
	engine := module + "internal/containerdengine"
	pkgs := []pkg{
		{ImportPath: module + "internal/supervisor", Deps: []string{module + "sandbox", containerdClient + "/api/types"}},
		{ImportPath: module + "internal/evaluate", Deps: []string{"github.com/containerd/errdefs", containerdClient + "x/y"}},
		{ImportPath: module + "internal/bundle", Deps: []string{engine, containerdClient}},
	}
	for _, tc := range []struct {
		edge edge
		want string // "" for no violation
	}{
		{edge{"internal/supervisor", containerdClient, "x"}, "internal/supervisor depends on " + containerdClient + "/api/types"},
		{edge{"internal/evaluate", containerdClient, "x"}, ""},
		{edge{"internal/gone", containerdClient, "x"}, `no package matches "internal/gone"`},
	} {
		got := foreignViolations(pkgs, []edge{tc.edge})
		checkViolations(t, fmt.Sprint(tc.edge), got, tc.want)
	}
	if got := violations(pkgs, []edge{{"internal/bundle", "internal/containerdengine", "x"}}); len(got) != 1 ||
		!strings.Contains(got[0], "internal/bundle depends on "+engine) {
		t.Errorf("an edge to the engine: got %q, want bundle's dependency on it", got)
	}

	imps := []imports{
		{ImportPath: engine, Imports: []string{containerdClient, containerdClient + "/namespaces"}},
		{ImportPath: module + "internal/broker", Imports: []string{"github.com/containerd/errdefs"}, TestImports: []string{containerdClient + "/errdefs"}},
		{ImportPath: module + "integration/hostile", XTestImports: []string{module + "internal/containerdengine"}},
		{ImportPath: module + "internal/server", Imports: []string{engine}},
		{ImportPath: module + "cmd/sandboxd", Imports: []string{engine}},
	}
	rule := func(target string, importers ...string) directOnly { return directOnly{target, importers, "x"} }
	for _, tc := range []struct {
		rule directOnly
		want []string // the violations, in order, each by a part of it
	}{
		{rule(containerdClient, "internal/containerdengine"), []string{"internal/broker imports " + containerdClient + "/errdefs in its tests"}},
		{rule(containerdClient, "internal/containerdengine", "internal/broker"), nil},
		{rule(engine, "cmd/sandboxd"), []string{"integration/hostile imports " + engine + " in its tests", "internal/server imports " + engine + ":"}},
		{rule(engine, "cmd/sandboxd", "internal/server", "integration/..."), nil},
		{rule(engine, "cmd/sandboxd", "internal/server", "integration/...", "bench"), []string{`no package matches "bench"`}},
		{rule("github.com/containerd/fifo", "internal/containerdengine"), []string{"no package imports github.com/containerd/fifo"}},
	} {
		got := directViolations(imps, []directOnly{tc.rule})
		if len(got) != len(tc.want) {
			t.Errorf("%v: got %q, want %d violations %q", tc.rule, got, len(tc.want), tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%v: violation %d is %q, want it to contain %q", tc.rule, i, got[i], w)
			}
		}
	}
}

// checkViolations fails unless got is no violation (want "") or one
// containing want.
func checkViolations(t *testing.T, name string, got []string, want string) {
	t.Helper()
	switch {
	case want == "" && len(got) != 0:
		t.Errorf("%s: got %q, want no violation", name, got)
	case want != "" && (len(got) != 1 || !strings.Contains(got[0], want)):
		t.Errorf("%s: got %q, want one violation containing %q", name, got, want)
	}
}
