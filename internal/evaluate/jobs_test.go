package evaluate

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// A judge accepts only the exact jobs the bundle prescribes: any change to
// the command, an input, the environment, the outputs or the limits of a
// grader or candidate job is refused.
func TestSameJobRefusesAnyOtherJob(t *testing.T) {
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	e := mustOf(t, b, "")
	export := "sha256:" + strings.Repeat("e", 64)
	want := e.GraderJob(export, "g")
	if err := SameJob("grader", sealed(t, want), want); err != nil {
		t.Fatalf("the bundle's own grader job: %v", err)
	}
	for name, change := range map[string]func(*sandbox.Job){
		"argv":                     func(j *sandbox.Job) { j.Argv = []string{"/bin/sh", "-c", "echo ok"} },
		"env":                      func(j *sandbox.Job) { j.Env["LD_PRELOAD"] = "/work/x.so" },
		"export mounted elsewhere": func(j *sandbox.Job) { j.Inputs[1].Path = "/inputs/other" },
		"another export":           func(j *sandbox.Job) { j.Inputs[1].Digest = "sha256:" + strings.Repeat("f", 64) },
		"another bundle layer":     func(j *sandbox.Job) { j.Inputs[0].Digest = export },
		"outputs":                  func(j *sandbox.Job) { j.Outputs = []string{"/work/elsewhere"} },
		"limits":                   func(j *sandbox.Job) { j.Limits.WallTimeMS++ },
		"runtime":                  func(j *sandbox.Job) { j.Runtime = sandbox.RuntimeRunsc },
	} {
		t.Run(name, func(t *testing.T) {
			got := e.GraderJob(export, "g")
			change(&got)
			if err := SameJob("grader", sealed(t, got), want); err == nil {
				t.Fatal("a changed grader job was accepted")
			}
		})
	}
}

// A job's role is read back from its signed id exactly as JobID wrote it.
func TestParseJobIDInvertsJobID(t *testing.T) {
	for _, c := range []string{"", "known-good", "known-bad"} {
		for _, r := range []string{RoleCandidate, RoleGrader} {
			id := JobID("run-0a1b", c, r)
			run, control, role, ok := ParseJobID(id)
			if !ok || run != "run-0a1b" || control != c || role != r {
				t.Errorf("ParseJobID(%q) = %q, %q, %q, %t; want run-0a1b, %q, %q", id, run, control, role, ok, c, r)
			}
		}
	}
	for _, id := range []string{"run-0a1b", "grader", "-grader", "run-0a1b-known-good", "run-0a1b-exporter"} {
		if run, control, role, ok := ParseJobID(id); ok {
			t.Errorf("ParseJobID(%q) = %q, %q, %q; want no job of a run", id, run, control, role)
		}
	}
}

// The supervisor's evidence names the candidate job (the grader's own when
// it graded the workspace itself) and opens the report artifact, if the
// store has it.
func TestEvidence(t *testing.T) {
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	report, err := blobs.PutBytes([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	p := supervisor.Policy{Format: supervisor.FormatGoTestJSON, ReportPath: "/work/out/report.json", AllReported: true}
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	grader := sandbox.Result{JobID: "g", JobDigest: d("1"), Artifacts: []sandbox.Artifact{{Path: p.ReportPath, Digest: report, Size: 2}}}
	cand := sandbox.Result{JobID: "c", JobDigest: d("2")}
	for name, tc := range map[string]struct {
		e          Results
		wantJob    string
		wantReport bool
	}{
		"grader alone":         {Results{Workspace: d("3"), Grader: grader}, d("1"), true},
		"with a candidate job": {Results{Workspace: d("3"), Grader: grader, Candidate: &cand}, d("2"), true},
		"report not in the store": {Results{Grader: sandbox.Result{JobDigest: d("1"), Artifacts: []sandbox.Artifact{{Path: p.ReportPath, Digest: d("4")}}}},
			d("1"), false},
	} {
		t.Run(name, func(t *testing.T) {
			ev, done := evidenceOf(blobs, d("5"), "", d("6"), p, tc.e, nil)
			defer done()
			if ev.CandidateJobDigest != tc.wantJob || (ev.Candidate != nil) != (tc.e.Candidate != nil) || ev.WorkspaceDigest != tc.e.Workspace {
				t.Errorf("candidate job %s (result given: %t), workspace %q; want %s, %t, %q", ev.CandidateJobDigest, ev.Candidate != nil, ev.WorkspaceDigest, tc.wantJob, tc.e.Candidate != nil, tc.e.Workspace)
			}
			if (ev.Report != nil) != tc.wantReport {
				t.Errorf("report opened: %t, want %t", ev.Report != nil, tc.wantReport)
			}
		})
	}
}

// The host's runtime is honoured: an evaluation on runsc builds runsc jobs,
// and a judge rebuilding them with that runtime accepts them.
func TestJobsRunOnTheHostsRuntime(t *testing.T) {
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	export := "sha256:" + strings.Repeat("e", 64)
	for _, rt := range []string{"", sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		want := rt
		if want == "" {
			want = sandbox.RuntimeRunc
		}
		e := mustOf(t, b, rt)
		g := e.GraderJob(export, "g")
		c := e.CandidateJob(export, "c")
		if g.Runtime != want || c.Runtime != want {
			t.Errorf("runtime %q: grader %q candidate %q, want %q", rt, g.Runtime, c.Runtime, want)
		}
	}
}

// A plan's jobs run on the host's runtime too, as an evaluation's do:
// the candidate job, the grader template, and the grader job of a bundle
// without a candidate command (before, every plan job was runc).
func TestPlanRunsOnTheHostsRuntime(t *testing.T) {
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	ws := "sha256:" + strings.Repeat("e", 64)
	noCandidate := b.Manifest
	noCandidate.Candidate = nil
	for _, rt := range []string{"", sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		want := runtimeOr(rt)
		e := mustOf(t, b, rt)
		p, err := e.Plan(ws, "c", "g")
		if err != nil {
			t.Fatal(err)
		}
		if p.Candidate == nil || p.Candidate.Runtime != want || p.Grader.Runtime != want {
			t.Errorf("runtime %q: candidate %+v grader %q, want %q", rt, p.Candidate, p.Grader.Runtime, want)
		}
		if p.Candidate != nil && p.Candidate.Digest != sealed(t, e.CandidateJob(ws, "c")).Digest {
			t.Errorf("runtime %q: the plan's candidate job is not the one an evaluation runs", rt)
		}
		nc, err := New(noCandidate, b.Digest, b.LayerDigest, rt)
		if err != nil {
			t.Fatal(err)
		}
		if p, err = nc.Plan(ws, "c", "g"); err != nil {
			t.Fatal(err)
		}
		if p.Grader.Digest != sealed(t, nc.GraderJob(ws, "g")).Digest {
			t.Errorf("runtime %q: the plan's grader job is not the one an evaluation runs (runtime %q)", rt, p.Grader.Runtime)
		}
	}
}

func mustOf(t *testing.T, b *bundle.Bundle, runtime string) *Evaluation {
	t.Helper()
	e, err := Of(b, runtime)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sealed(t *testing.T, j sandbox.Job) sandbox.Job {
	t.Helper()
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

// A bundle without a candidate command has no candidate job: building one
// (as a judge rebuilding a claimed candidate job does) must not panic, and
// what it builds never validates.
func TestCandidateJobOfABundleWithoutCandidate(t *testing.T) {
	var m bundle.Manifest
	m.Image = "sha256:" + strings.Repeat("a", 64)
	j := (&Evaluation{Manifest: m}).CandidateJob("", "c")
	if len(j.Argv) != 0 {
		t.Fatalf("got argv %q, want none", j.Argv)
	}
	if err := j.Seal(); err == nil {
		t.Error("a candidate job without argv sealed, want a validation error")
	}
}
