package evaluate

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The instance a bundle names reaches everything an evaluation builds
// from it: the daemon's plan, the supervisor's evidence (so the binding
// and the statement) for the candidate and each control, and the signed
// assessment's predicate.
func TestTheBundlesInstanceIsCarried(t *testing.T) {
	const id = "astropy__astropy-12907"
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	m := b.Manifest
	m.Instance = id
	e, err := New(m, b.Digest, b.LayerDigest, "")
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := sandbox.DigestBytes([]byte("ws"))
	p, err := e.Plan(ws, "c", "g")
	if err != nil || p.Instance != id {
		t.Fatalf("plan: instance %q, %v; want %q", p.Instance, err, id)
	}

	c, g := *p.Candidate, sealed(t, e.GraderJob(ws, "g"))
	grader := sandbox.Result{Schema: sandbox.ResultSchema, JobID: g.ID, JobDigest: g.Digest, Status: sandbox.StatusSucceeded}
	candidate := sandbox.Result{Schema: sandbox.ResultSchema, JobID: c.ID, JobDigest: c.Digest, Status: sandbox.StatusSucceeded}
	r := Results{Workspace: ws, Candidate: &candidate, Grader: grader}
	var seen []string
	judge := func(ev supervisor.Evidence) (supervisor.Assessment, []byte, error) {
		seen = append(seen, ev.Instance)
		return supervisor.Assessment{Verdict: supervisor.Inconclusive}, []byte("{}"), nil
	}
	controls := map[supervisor.ControlKind]Results{supervisor.ControlKnownGood: r, supervisor.ControlKnownBad: r}
	if _, _, _, err := e.Judge(blobs, controls, r, judge); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || seen[0] != id || seen[1] != id || seen[2] != id {
		t.Errorf("the supervisor was given instances %q, want %q for both controls and the candidate", seen, id)
	}

	a := supervisor.Assessment{
		SupervisorRevision: supervisor.Revision, Verdict: supervisor.Inconclusive, Reasons: []string{"report_missing"}, Checks: []supervisor.CheckResult{},
		Binding: supervisor.Binding{BundleDigest: b.Digest, Instance: id, CandidateJobDigest: c.Digest, GraderJobDigest: g.Digest},
	}
	pa, err := PublicAssessment(a, []byte("{}"), Judged{Candidate: c, Grader: g})
	if err != nil || pa.Instance != id {
		t.Errorf("signed assessment: instance %q, %v; want %q", pa.Instance, err, id)
	}
}
