package archtest

import (
	"fmt"
	"strings"
	"testing"
)

const (
	module = "github.com/sandboxd/sandboxd/"
	// engineClient stands for the container engine's Go clients.
	engineClient = "github.com/moby/moby/client"
)

var engineClients = []string{engineClient, "github.com/docker/docker"}

// edge is a "never" edge of internal/README.md: no package matching from
// may depend on a package matching to, directly or through another. A
// pattern is a path in the module (or engineClient); "/..." also matches
// the packages below it.
type edge struct {
	from, to, why string
}

// neverEdges are the package map's "never" column (internal/README.md).
var neverEdges = []edge{
	// The public surface: what a verifier imports stands alone.
	{"sandbox/...", "internal/...", "a verifier imports sandbox/ alone"},
	{"sandbox/...", engineClient, "a verifier never links the engine"},
	// What judges and what attests never reaches the broker or the engine:
	// a candidate's sandbox cannot change the authority that judges it.
	{"internal/supervisor", "internal/broker/...", "the judge never reaches the broker"},
	{"internal/supervisor", engineClient, "the judge never links the engine"},
	{"internal/supervisor", "internal/receipt", "the judge does not sign; receipt does"},
	{"internal/receipt", "internal/broker/...", "the signer never reaches the broker"},
	{"internal/receipt", engineClient, "the signer never links the engine"},
	{"internal/receipt", "internal/supervisor", "the signer never judges"},
	{"internal/evaluate", "internal/broker/...", "an evaluation drives the broker through its own small interface"},
	{"internal/evaluate", engineClient, "what defines and judges an evaluation never links the engine"},
	{"internal/evidence", "internal/broker/...", "re-judging evidence never reaches the broker"},
	{"internal/evidence", engineClient, "re-judging evidence never links the engine"},
	{"internal/bundle", "internal/broker/...", "bundle checks never reach the broker"},
	{"internal/bundle", engineClient, "bundle checks never link the engine"},
	// Nor do they reach the containerd engine (their edges to its client,
	// outside this module, are in containerd_test.go).
	{"internal/supervisor", "internal/containerdengine", "the judge never reaches an engine"},
	{"internal/receipt", "internal/containerdengine", "the signer never reaches an engine"},
	{"internal/bundle", "internal/containerdengine", "bundle checks never reach an engine"},
	{"internal/evaluate", "internal/containerdengine", "an evaluation drives the broker through its own small interface"},
	{"internal/evidence", "internal/containerdengine", "re-judging evidence never reaches an engine"},
	{"internal/store", "internal/...", "the blob store is a leaf"},
	{"internal/store", engineClient, "the blob store never links the engine"},
	{"internal/journal", "internal/...", "the journal is a leaf"},
	{"internal/journal", engineClient, "the journal never links the engine"},
	// A JUnit file renders a verified assessment: nothing that runs jobs.
	{"internal/junitreport", "internal/broker/...", "the JUnit writer renders an assessment, never runs or reads jobs"},
	{"internal/junitreport", "internal/evaluate", "the JUnit writer renders an assessment, never runs or reads jobs"},
	{"internal/junitreport", engineClient, "the JUnit writer never links the engine"},
	{"internal/progress", "internal/...", "progress is a leaf"},
	{"internal/filedigest", "internal/...", "file digests are a leaf"},
	{"internal/filedigest", engineClient, "file digests never link the engine"},
	// The fleet distributes sealed jobs and their outcomes, never
	// authority: what judges, signs, checks inputs or runs a job never
	// reaches it (only the daemon and the CLI join a fleet).
	{"internal/broker/...", "sandbox/fleet", "the broker runs one job on this host; the daemon joins the fleet"},
	{"internal/supervisor", "sandbox/fleet", "the judge never reaches the fleet"},
	{"internal/receipt", "sandbox/fleet", "the signer never reaches the fleet"},
	{"internal/bundle", "sandbox/fleet", "bundle checks never reach the fleet"},
	{"sandbox/client", "sandbox/fleet", "the daemon's client links no NATS client"},
	// The broker runs jobs and reports what happened; it never judges,
	// never signs, and knows nothing of the daemon above it.
	{"internal/broker", "internal/supervisor", "the broker never judges"},
	{"internal/broker", "internal/evaluate", "the broker never judges"},
	{"internal/broker", "internal/receipt", "the broker never signs"},
	{"internal/broker", "internal/server", "the broker knows nothing of the daemon"},
	{"internal/broker", "internal/journal", "the daemon's journal is the server's"},
	{"internal/broker", "internal/selfcheck/...", "the self-check drives the broker, not the reverse"},
	// The containerd engine translates the broker's calls, as the broker
	// runs jobs: it never judges, signs or joins the fleet.
	{"internal/containerdengine", "internal/supervisor", "the engine never judges"},
	{"internal/containerdengine", "internal/evaluate", "the engine never judges"},
	{"internal/containerdengine", "internal/receipt", "the engine never signs"},
	{"internal/containerdengine", "internal/journal", "the daemon's journal is the server's"},
	{"internal/containerdengine", "internal/selfcheck/...", "the self-check drives the engine, not the reverse"},
	{"internal/containerdengine", "sandbox/fleet", "the engine runs containers on this host; the daemon joins the fleet"},
	// The programs that run inside a sandbox carry nothing of the host.
	{"internal/shim/...", "internal/...", "the in-container helper links nothing of the host"},
	{"internal/shim/...", engineClient, "the in-container helper never links the engine"},
	{"cmd/sandboxd", "internal/shim/helper", "the daemon speaks the helper's protocol (internal/shim) but never links the in-container program"},
	{"internal/broker", "internal/shim/helper", "the broker speaks the helper's protocol but never links the in-container program"},
	{"internal/containerdengine", "internal/shim/helper", "the engine runs the helper's binary but never links it"},
	{"internal/selfcheck/probe", "internal/...", "the in-container probe links nothing of the host"},
	{"internal/selfcheck/probe", engineClient, "the in-container probe never links the engine"},
	// Layering: nothing reaches up to the daemon or the command.
	{"internal/...", "internal/server", "only cmd/ wires the daemon"},
	{"internal/...", "cmd/...", "commands are wiring, never a library"},
	{"profiles/seccomp/...", "internal/...", "the profile is a published artifact, built from upstream's alone"},
	// The engine test harness is for tests only.
	{"...", "internal/testharness", "only tests use the test harness"},
	{"...", "internal/broker/enginefake", "only tests use the in-memory engine"},
}

// match reports whether the package path p matches pattern.
func match(pattern, p string) bool {
	if pattern == engineClient {
		for _, c := range engineClients {
			if p == c || strings.HasPrefix(p, c+"/") {
				return true
			}
		}
		return false
	}
	if pattern == "..." {
		return strings.HasPrefix(p, module)
	}
	p, ok := strings.CutPrefix(p, module)
	if !ok {
		return false
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == base || strings.HasPrefix(p, base+"/")
	}
	return p == pattern
}

// within reports whether d is inside e's own tree where e's target covers
// that tree: the shim's packages may import each other, though the shim
// may import nothing else of internal/.
func within(e edge, d string) bool {
	base, ok := strings.CutSuffix(e.from, "/...")
	return ok && match(e.to, module+base) && match(e.from, d)
}

// violations returns every dependency that breaks an edge, and every edge
// whose from matches no package (a rename would silently check nothing).
func violations(pkgs []pkg, edges []edge) []string {
	var out []string
	for _, e := range edges {
		matched := false
		for _, p := range pkgs {
			if !match(e.from, p.ImportPath) {
				continue
			}
			matched = true
			for _, d := range p.Deps {
				if match(e.to, d) && !within(e, d) {
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

// The "never" edges of the package map hold, transitively.
func TestNeverEdges(t *testing.T) {
	for _, v := range violations(listPackages(t), neverEdges) {
		t.Error(v)
	}
}

// The check itself catches a violating import, a transitive one, and a
// rule about a package that no longer exists.
func TestNeverEdgesCatchViolations(t *testing.T) {
	pkgs := []pkg{
		{ImportPath: module + "internal/broker", Deps: []string{module + "internal/store", module + "internal/supervisor"}},
		{ImportPath: module + "sandbox", Deps: []string{"fmt"}},
		{ImportPath: module + "sandbox/client", Deps: []string{module + "sandbox", engineClient + "/pkg/jsonmessage"}},
		{ImportPath: module + "internal/shim", Deps: []string{"os"}},
		{ImportPath: module + "internal/shim/proto", Deps: []string{module + "internal/shim"}},
		{ImportPath: module + "internal/evaluate", Deps: []string{module + "internal/broker", module + "internal/server"}},
		{ImportPath: module + "internal/server", Deps: []string{module + "internal/evaluate"}},
	}
	cases := []struct {
		edge edge
		want string // "" for no violation
	}{
		{edge{"internal/broker", "internal/supervisor", "x"}, "internal/broker depends on " + module + "internal/supervisor"},
		{edge{"internal/broker", "internal/receipt", "x"}, ""},
		{edge{"sandbox/...", engineClient, "x"}, "sandbox/client depends on " + engineClient + "/pkg/jsonmessage"},
		{edge{"internal/shim/...", "internal/...", "x"}, ""}, // within itself
		{edge{"internal/...", "internal/server", "x"}, "internal/evaluate depends on " + module + "internal/server"},
		{edge{"internal/gone", "internal/broker", "x"}, `no package matches "internal/gone"`},
	}
	for _, tc := range cases {
		got := violations(pkgs, []edge{tc.edge})
		switch {
		case tc.want == "" && len(got) != 0:
			t.Errorf("%v: got %q, want no violation", tc.edge, got)
		case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
			t.Errorf("%v: got %q, want one violation containing %q", tc.edge, got, tc.want)
		}
	}
}
