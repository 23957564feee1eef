package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The assess endpoint judges under the policy of the bundle the grader
// job ran, proven by digests, never under one the caller picks.
func TestAssessPolicyComesFromTheJobsBundle(t *testing.T) {
	b, blob := exampleBundle(t)
	manifest, config := blob(b.Digest), blob(b.ConfigDigest)
	job := sandbox.Job{ID: "g", Bundle: b.Digest, Image: b.Manifest.Image}

	bm, layer, err := bundleOf(job, manifest, config)
	if err != nil {
		t.Fatalf("the job's own bundle: %v", err)
	}
	if layer != b.LayerDigest {
		t.Fatalf("layer %s, want the bundle's %s", layer, b.LayerDigest)
	}
	p, err := evaluate.PolicyOf(bm)
	if err != nil {
		t.Fatal(err)
	}
	if string(p.Format) != b.Manifest.Report.Format || p.ReportPath != b.Manifest.Report.Path {
		t.Fatalf("policy %+v does not come from bundle.json", p)
	}

	lax := []byte(strings.Replace(string(config), `"required_checks"`, `"required_checkz"`, 1))
	otherImage := job
	otherImage.Image = "sha256:" + strings.Repeat("0", 64)
	noBundle := job
	noBundle.Bundle = ""
	for _, tc := range []struct {
		name             string
		job              sandbox.Job
		manifest, config []byte
		want             string
	}{
		{"no bundle on the job", noBundle, manifest, config, "names no bundle"},
		{"another manifest", job, append(manifest, ' '), config, "bundle_manifest hashes to"},
		{"another bundle.json", job, manifest, lax, "bundle_config hashes to"},
		{"another image", otherImage, manifest, config, "names image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := bundleOf(tc.job, tc.manifest, tc.config)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("got %v, want an invalid-input error containing %q", err, tc.want)
			}
		})
	}
}

// The assess endpoint judges only the jobs the bundle prescribes: a grader
// job that differs from the bundle's grader in anything (here one more
// environment variable) is refused, and the exact one is judged.
func TestAssessJudgesOnlyTheBundlesJobs(t *testing.T) {
	b, blob := exampleBundle(t)
	f := assessFixture(t)
	bm := b.Manifest
	ws := sandbox.DigestBytes([]byte("workspace"))
	sealed := func(j sandbox.Job) sandbox.Job {
		if err := j.Seal(); err != nil {
			t.Fatal(err)
		}
		return j
	}
	run := func(j sandbox.Job) {
		if code, _, _ := f.submit(t, j); code/100 != 2 {
			t.Fatalf("submit %s: %d", j.ID, code)
		}
		f.wait(t, j.ID)
	}
	cand := sealed(evalOf(t, bm, b.Digest, "", "").CandidateJob(ws, "c1"))
	run(cand)
	// The fake broker collects nothing: the candidate's export is the
	// canonical tar of no files.
	export, err := evaluate.ExportOf(context.Background(), f.srv.cfg.Blobs, sandbox.Result{}, bm.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	exact := sealed(evalOf(t, bm, b.Digest, b.LayerDigest, "").GraderJob(export, "g-exact"))
	other := evalOf(t, bm, b.Digest, b.LayerDigest, "").GraderJob(export, "g-other")
	other.Env["LD_PRELOAD"] = "/inputs/candidate-export/x.so"
	other = sealed(other)
	run(exact)
	run(other)
	assess := func(grader string) (int, string) {
		body, _ := json.Marshal(AssessRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest),
			GraderJobID: grader, CandidateJobID: cand.ID, WorkspaceDigest: ws})
		resp, out := f.do(t, http.MethodPost, "/v1/assess", body)
		return resp.StatusCode, string(out)
	}
	if code, out := assess(other.ID); code != http.StatusConflict || !strings.Contains(out, "is not the bundle's grader job") {
		t.Fatalf("another grader job: %d %s, want 409 naming the difference", code, out)
	}
	code, first := assess(exact.ID)
	if code != http.StatusOK {
		t.Fatalf("the bundle's grader job: %d %s, want an assessment", code, first)
	}
	// The answer is signed by the daemon's key, about exactly both jobs,
	// and the same request gets the same bytes (a signature is random: it
	// is retained, not made again).
	var resp sandbox.AssessResponse
	if err := json.Unmarshal([]byte(first), &resp); err != nil {
		t.Fatal(err)
	}
	a, err := sandbox.VerifyAssessment(f.keys, resp.Assessment, cand, exact)
	if err != nil {
		t.Fatalf("verify the signed assessment: %v", err)
	}
	if a.ManifestDigest != b.Digest || a.CandidateDigest != cand.Digest || a.GraderDigest != exact.Digest || a.SupervisorRevision != supervisor.Revision || len(a.Checks) == 0 {
		t.Fatalf("signed assessment %+v does not bind the bundle, both jobs and the supervisor revision", a)
	}
	if _, err := sandbox.VerifyAssessment(f.keys, resp.Assessment, cand, other); !errors.Is(err, sandbox.ErrJobBinding) {
		t.Fatalf("verified against another grader job: %v, want a job_binding error", err)
	}
	if code, again := assess(exact.ID); code != http.StatusOK || again != first {
		t.Fatalf("asked again: %d, identical=%v; want the same bytes", code, again == first)
	}
}

// reportingBroker is the fake broker whose grader runs leave the report
// the test chose for their job id (stored in the daemon's blobs by the
// test) as their one artifact.
type reportingBroker struct {
	*fakeBroker
	path    string
	reports map[string][]byte
}

func (b *reportingBroker) RunWithHooks(ctx context.Context, job sandbox.Job, h broker.Hooks) (sandbox.Result, error) {
	res, err := b.fakeBroker.RunWithHooks(ctx, job, h)
	if r, ok := b.reports[job.ID]; ok && err == nil {
		res.Artifacts = []sandbox.Artifact{{Path: b.path, Digest: sandbox.DigestBytes(r), Size: int64(len(r)), MediaType: "application/json"}}
		if bytes.Contains(r, []byte(`"Action":"fail"`)) {
			res.Status, res.ExitCode = sandbox.StatusFailed, 1 // as go test exits when a test failed
		}
	}
	return res, err
}

// goTestReport is a go test -json report of the example bundle's two
// required tests, TestAddOverflow passing or failing (without a package:
// the bundle requires the tests by their bare names).
func goTestReport(overflowPasses bool) []byte {
	last := "fail"
	if overflowPasses {
		last = "pass"
	}
	return []byte(`{"Action":"start"}
{"Action":"run","Test":"TestAdd"}
{"Action":"pass","Test":"TestAdd","Elapsed":0}
{"Action":"run","Test":"TestAddOverflow"}
{"Action":"` + last + `","Test":"TestAddOverflow","Elapsed":0}
{"Action":"` + last + `","Elapsed":0}
`)
}

// The assess endpoint judges a bundle's controls as `sandboxd run` does:
// given the controls' jobs (those the plan prescribed for them), the
// candidate gets the verdict its own report deserves and the signed
// assessment names both controls' outcomes; without them, it is
// inconclusive (control_missing), as before; a job of another workspace
// named as a control's is refused.
func TestAssessJudgesTheControls(t *testing.T) {
	ctx := context.Background()
	b, blob := exampleBundle(t)
	rb := &reportingBroker{fakeBroker: newFake(), path: b.Manifest.Report.Path, reports: map[string][]byte{}}
	assessments, err := supervisor.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) {
		c.Broker = rb
		c.Preflight = func(context.Context, sandbox.Job) error { return nil }
		c.Supervisor = supervisor.New(assessments)
	}, nil)
	if err := b.CopyLayer(f.srv.cfg.Blobs); err != nil {
		t.Fatal(err)
	}
	pass, fail := goTestReport(true), goTestReport(false)
	for _, r := range [][]byte{pass, fail} {
		if _, _, err := f.srv.cfg.Blobs.Put(bytes.NewReader(r), sandbox.DigestBytes(r), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	ws := sandbox.DigestBytes([]byte("workspace"))
	preq := sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g-pass", Controls: controlIDs("k")}
	body, _ := json.Marshal(preq)
	resp, out := f.do(t, http.MethodPost, "/v1/plan", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("plan: %d %s", resp.StatusCode, out)
	}
	var p sandbox.Plan
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Controls) != 2 {
		t.Fatalf("plan %s: want the jobs of both controls", out)
	}
	run := func(j sandbox.Job) {
		t.Helper()
		if code, _, _ := f.submit(t, j); code/100 != 2 {
			t.Fatalf("submit %s: %d", j.ID, code)
		}
		f.wait(t, j.ID)
	}
	// The fake broker collects nothing from a candidate job: every export
	// is the canonical tar of no files.
	export, err := evaluate.ExportOf(ctx, f.srv.cfg.Blobs, sandbox.Result{}, b.Manifest.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	grade := func(template, candidate sandbox.Job, id string, report []byte) sandbox.Job {
		t.Helper()
		template.ID = id
		if err := template.Seal(); err != nil {
			t.Fatal(err)
		}
		g, err := sandbox.GraderJob(template, candidate, sandbox.Result{JobID: candidate.ID, JobDigest: candidate.Digest}, export)
		if err != nil {
			t.Fatal(err)
		}
		rb.reports[id] = report
		run(g)
		return g
	}
	run(*p.Candidate)
	gPass := grade(p.Grader, *p.Candidate, "g-pass", pass)
	gFail := grade(p.Grader, *p.Candidate, "g-fail", fail)
	// An assessment is retained for its jobs: judged with its controls,
	// it is not judged again without them (and the other way round).
	gAlone := grade(p.Grader, *p.Candidate, "g-alone", pass)
	for kind, report := range map[string][]byte{sandbox.ControlKnownGood: pass, sandbox.ControlKnownBad: fail} {
		c := p.Controls[kind]
		run(*c.Candidate)
		grade(c.Grader, *c.Candidate, c.Grader.ID, report)
	}

	assess := func(grader sandbox.Job, controls map[string]sandbox.ControlIDs) (int, []byte) {
		body, _ := json.Marshal(AssessRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest),
			GraderJobID: grader.ID, CandidateJobID: p.Candidate.ID, WorkspaceDigest: ws, Controls: controls})
		resp, out := f.do(t, http.MethodPost, "/v1/assess", body)
		return resp.StatusCode, out
	}
	signed := func(grader sandbox.Job, out []byte) sandbox.Assessment {
		t.Helper()
		var resp sandbox.AssessResponse
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		a, err := sandbox.VerifyAssessment(f.keys, resp.Assessment, *p.Candidate, grader)
		if err != nil {
			t.Fatalf("verify the signed assessment: %v", err)
		}
		return a
	}
	for _, tc := range []struct {
		grader sandbox.Job
		want   sandbox.Verdict
	}{{gPass, sandbox.VerdictPassed}, {gFail, sandbox.VerdictFailed}} {
		code, out := assess(tc.grader, preq.Controls)
		if code != http.StatusOK {
			t.Fatalf("%s with its controls: %d %s", tc.grader.ID, code, out)
		}
		a := signed(tc.grader, out)
		if a.Verdict != tc.want || len(a.Reasons) != 0 {
			t.Errorf("%s with its controls: %s %v, want %s", tc.grader.ID, a.Verdict, a.Reasons, tc.want)
		}
		var names []string
		for _, r := range a.ObservationRefs {
			names = append(names, r.Name)
		}
		for _, want := range []string{"known-good/assessment", "known-good/candidate/result", "known-good/grader/result", "known-bad/assessment", "known-bad/candidate/result", "known-bad/grader/result"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s: the signed assessment's observations %v do not name %s", tc.grader.ID, names, want)
			}
		}
	}

	// Without the controls: judged as before, inconclusive.
	code, out := assess(gAlone, nil)
	if code != http.StatusOK {
		t.Fatalf("without controls: %d %s", code, out)
	}
	if a := signed(gAlone, out); a.Verdict != sandbox.VerdictInconclusive || !strings.Contains(strings.Join(a.Reasons, " "), string(supervisor.RuleControlMissing)) {
		t.Errorf("without controls: %s %v, want inconclusive, control_missing", a.Verdict, a.Reasons)
	}

	// Its controls are part of what a grader job was judged with: asked
	// again without them, the retained assessment is not made again.
	if code, out := assess(gPass, nil); code != http.StatusConflict {
		t.Errorf("judged with controls, asked without: %d %s, want 409", code, out)
	}

	// The candidate's own jobs named as the known-good control's: not on
	// the control's workspace, refused.
	wrong := controlIDs("k")
	wrong[sandbox.ControlKnownGood] = sandbox.ControlIDs{CandidateJobID: p.Candidate.ID, GraderJobID: gPass.ID}
	if code, out := assess(gPass, wrong); code != http.StatusConflict || !strings.Contains(string(out), "control known-good") || !strings.Contains(string(out), "is not the bundle's candidate job") {
		t.Errorf("a control job of another workspace: %d %s, want 409", code, out)
	}
	undeclared := controlIDs("k")
	undeclared["known-ugly"] = sandbox.ControlIDs{CandidateJobID: "x", GraderJobID: "y"}
	if code, out := assess(gPass, undeclared); code != http.StatusBadRequest || !strings.Contains(string(out), "declares no known-ugly") {
		t.Errorf("an undeclared control: %d %s, want 400", code, out)
	}
}
