package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

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
