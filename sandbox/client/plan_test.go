package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// answering serves one canned JSON answer on a unix socket.
func answering(t *testing.T, answer any) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(answer)
	}))
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	t.Cleanup(hs.Close)
	return socket
}

// A plan not bound to the request (another bundle, other ids, another
// workspace) and an assessment not signed by the pinned key, or about
// other jobs, are refused by the client, whatever the daemon answers.
func TestPlanAndAssessAreChecked(t *testing.T) {
	ctx := context.Background()
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := receipt.NewEphemeralSigner()
	keys, _ := sandbox.ParseKeySet(signer.PublicKeyPEM())
	manifest := []byte(`{"manifest":1}`)
	bundle := sandbox.DigestBytes(manifest)
	ws := sandbox.DigestBytes([]byte("ws"))
	job := func(id string, inputs ...sandbox.Input) sandbox.Job {
		j := newJob(t, id, "true")
		j.Digest, j.Bundle, j.Inputs = "", bundle, inputs
		if err := j.Seal(); err != nil {
			t.Fatal(err)
		}
		return j
	}
	cand := job("c", sandbox.Input{Name: "workspace", Digest: ws, Path: sandbox.WorkPath, Writable: true})
	grader := job("g")
	req := sandbox.PlanRequest{BundleManifest: manifest, WorkspaceDigest: ws, CandidateJobID: "c", GraderJobID: "g"}
	good := sandbox.Plan{ManifestDigest: bundle, Image: cand.Image, WorkspaceDigest: ws, Candidate: &cand, Grader: grader}
	if _, err := client.New(answering(t, good), keys).Plan(ctx, req); err != nil {
		t.Fatalf("a plan bound to the request: %v", err)
	}
	otherBundle := good
	otherBundle.ManifestDigest = sandbox.DigestBytes([]byte("other"))
	swapped := good
	swapped.Candidate, swapped.Grader = &grader, cand
	otherWS := req
	otherWS.WorkspaceDigest = sandbox.DigestBytes([]byte("other ws"))
	// A bundle naming an instance: the plan names the same one.
	const id = "astropy__astropy-12907"
	named := good
	named.Instance = id
	namedReq := req
	namedReq.BundleConfig = []byte(`{"schema_version":"sandboxd.bundle/v1","instance":"` + id + `"}`)
	if _, err := client.New(answering(t, named), keys).Plan(ctx, namedReq); err != nil {
		t.Errorf("a plan naming the bundle's instance: %v", err)
	}
	otherInstance := named
	otherInstance.Instance = "astropy__astropy-13033"
	for _, tc := range []struct {
		name string
		plan sandbox.Plan
		req  sandbox.PlanRequest
	}{
		{"another bundle", otherBundle, req},
		{"the ids swapped", swapped, req},
		{"another workspace", good, otherWS},
		{"an instance the bundle does not name", named, req},
		{"no instance where the bundle names one", good, namedReq},
		{"another instance", otherInstance, namedReq},
	} {
		if _, err := client.New(answering(t, tc.plan), keys).Plan(ctx, tc.req); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s: %v, want the plan refused", tc.name, err)
		}
	}

	a := sandbox.Assessment{Schema: sandbox.SignedAssessmentSchema, ManifestDigest: bundle, SupervisorRevision: "r",
		CandidateJob: "c", CandidateDigest: cand.Digest, GraderJob: "g", GraderDigest: grader.Digest,
		Verdict: sandbox.VerdictFailed, Reasons: []string{}, Checks: []sandbox.AssessedCheck{{Name: "x", Status: sandbox.VerdictFailed, Evidence: []string{}}}, ObservationRefs: []sandbox.ObservationRef{}}
	sign := func(s *receipt.Signer) sandbox.AssessResponse {
		subjects, _ := sandbox.AssessmentSubjects(cand, grader)
		pred, _ := sandbox.CanonicalJSON(a)
		env, err := s.SignStatement(sandbox.Statement{Type: sandbox.StatementType, Subject: subjects, PredicateType: sandbox.PredicateAssessment, Predicate: pred})
		if err != nil {
			t.Fatal(err)
		}
		return sandbox.AssessResponse{Assessment: env}
	}
	areq := sandbox.AssessRequest{GraderJobID: "g", CandidateJobID: "c"}
	if sa, err := client.New(answering(t, sign(signer)), keys).Assess(ctx, areq, cand, grader); err != nil || sa.Assessment.Verdict != sandbox.VerdictFailed {
		t.Fatalf("a signed assessment: %v", err)
	}
	if _, err := client.New(answering(t, sign(other)), keys).Assess(ctx, areq, cand, grader); !errors.Is(err, sandbox.ErrUnknownKey) {
		t.Errorf("signed by another key: %v", err)
	}
	if _, err := client.New(answering(t, sign(signer)), keys).Assess(ctx, areq, grader, cand); err == nil {
		t.Error("an assessment accepted for jobs the request does not name")
	}

	// The test-result statement beside it must say what the assessment
	// says: its verdict, its subject, its bundle and its checks.
	hexOf := func(d string) map[string]string { return map[string]string{"sha256": strings.TrimPrefix(d, "sha256:")} }
	withResult := func(result, subjectDigest, bundleDigest string, failed []string) sandbox.AssessResponse {
		resp := sign(signer)
		pred, _ := json.Marshal(map[string]any{
			"result": result, "configuration": []sandbox.Subject{{Name: "bundle", Digest: hexOf(bundleDigest)}},
			"passedTests": []string{}, "failedTests": failed,
		})
		env, err := signer.SignStatement(sandbox.Statement{Type: sandbox.StatementType, PredicateType: sandbox.PredicateTestResult,
			Subject: []sandbox.Subject{{Name: "candidate-job", Digest: hexOf(subjectDigest)}}, Predicate: pred})
		if err != nil {
			t.Fatal(err)
		}
		resp.TestResult = env
		return resp
	}
	if _, err := client.New(answering(t, withResult("FAILED", cand.Digest, bundle, []string{"x"})), keys).Assess(ctx, areq, cand, grader); err != nil {
		t.Errorf("a test-result that says what the assessment says: %v", err)
	}
	for _, tc := range []struct {
		name string
		resp sandbox.AssessResponse
	}{
		{"another verdict", withResult("PASSED", cand.Digest, bundle, []string{"x"})},
		{"another subject", withResult("FAILED", grader.Digest, bundle, []string{"x"})},
		{"another bundle", withResult("FAILED", cand.Digest, sandbox.DigestBytes([]byte("other")), []string{"x"})},
		{"other checks", withResult("FAILED", cand.Digest, bundle, []string{"y"})},
	} {
		if _, err := client.New(answering(t, tc.resp), keys).Assess(ctx, areq, cand, grader); !errors.Is(err, sandbox.ErrPredicate) && !errors.Is(err, sandbox.ErrSubject) {
			t.Errorf("a test-result with %s: got %v, want it refused", tc.name, err)
		}
	}
}

// A plan's control jobs are checked as the candidate's own: under the ids
// requested for that control, of the bundle and its image, the candidate
// job on the control's own workspace; the controls exactly those asked
// about; every id of the plan distinct.
func TestPlanControlsAreChecked(t *testing.T) {
	ctx := context.Background()
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := sandbox.ParseKeySet(signer.PublicKeyPEM())
	manifest := []byte(`{"manifest":1}`)
	bundle := sandbox.DigestBytes(manifest)
	ws, goodWS := sandbox.DigestBytes([]byte("ws")), sandbox.DigestBytes([]byte("good ws"))
	job := func(id string, inputs ...sandbox.Input) sandbox.Job {
		j := newJob(t, id, "true")
		j.Digest, j.Bundle, j.Inputs = "", bundle, inputs
		if err := j.Seal(); err != nil {
			t.Fatal(err)
		}
		return j
	}
	on := func(d string) sandbox.Input {
		return sandbox.Input{Name: "workspace", Digest: d, Path: sandbox.WorkPath, Writable: true}
	}
	cand, grader := job("c", on(ws)), job("g")
	goodC, goodG := job("kg-c", on(goodWS)), job("kg-g")
	req := sandbox.PlanRequest{BundleManifest: manifest, WorkspaceDigest: ws, CandidateJobID: "c", GraderJobID: "g",
		Controls: map[string]sandbox.ControlIDs{sandbox.ControlKnownGood: {CandidateJobID: "kg-c", GraderJobID: "kg-g"}}}
	plan := func(c sandbox.ControlPlan) sandbox.Plan {
		return sandbox.Plan{ManifestDigest: bundle, Image: cand.Image, WorkspaceDigest: ws, Candidate: &cand, Grader: grader,
			Controls: map[string]sandbox.ControlPlan{sandbox.ControlKnownGood: c}}
	}
	good := plan(sandbox.ControlPlan{WorkspaceDigest: goodWS, Candidate: &goodC, Grader: goodG})
	if _, err := client.New(answering(t, good), keys).Plan(ctx, req); err != nil {
		t.Fatalf("a plan with its control bound to the request: %v", err)
	}
	otherImage := goodC
	otherImage.Digest, otherImage.Image = "", "sha256:"+strings.Repeat("c", 64)
	if err := otherImage.Seal(); err != nil {
		t.Fatal(err)
	}
	reused := job("c", on(goodWS))
	noControls := good
	noControls.Controls = nil
	extra := good
	extra.Controls = map[string]sandbox.ControlPlan{sandbox.ControlKnownGood: good.Controls[sandbox.ControlKnownGood], sandbox.ControlKnownBad: good.Controls[sandbox.ControlKnownGood]}
	for _, tc := range []struct {
		name string
		plan sandbox.Plan
		want string
	}{
		{"the control's jobs on another workspace", plan(sandbox.ControlPlan{WorkspaceDigest: ws, Candidate: &goodC, Grader: goodG}), "does not take the workspace"},
		{"the control's ids swapped", plan(sandbox.ControlPlan{WorkspaceDigest: goodWS, Candidate: &goodG, Grader: goodC}), "known-good grader job is kg-c"},
		{"the control's job on another image", plan(sandbox.ControlPlan{WorkspaceDigest: goodWS, Candidate: &otherImage, Grader: goodG}), "on image"},
		{"no candidate job for the control", plan(sandbox.ControlPlan{WorkspaceDigest: goodWS, Grader: goodG}), "candidate job exactly when"},
		{"the control missing", noControls, "control known-good is missing"},
		{"a control not asked about", extra, "control known-bad was not asked about"},
	} {
		_, err := client.New(answering(t, tc.plan), keys).Plan(ctx, req)
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want the plan refused naming %q", tc.name, err, tc.want)
		}
	}
	sharing := req
	sharing.Controls = map[string]sandbox.ControlIDs{sandbox.ControlKnownGood: {CandidateJobID: "c", GraderJobID: "kg-g"}}
	if _, err := client.New(answering(t, plan(sandbox.ControlPlan{WorkspaceDigest: goodWS, Candidate: &reused, Grader: goodG})), keys).Plan(ctx, sharing); err == nil || !strings.Contains(err.Error(), "share id c") {
		t.Errorf("a control job with the candidate's id: %v, want refused", err)
	}
}
