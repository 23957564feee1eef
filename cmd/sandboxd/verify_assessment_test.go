package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
)

// sandboxd verify checks a signed assessment offline: its signature with
// the pinned key, its statement, that its verdict is no better than its
// checks, and with --job that it judged that job.
func TestVerifyCommandAssessment(t *testing.T) {
	f := newVerifyFixture(t)
	s, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(f.dir, "assessor.pub")
	if err := os.WriteFile(pub, s.PublicKeyPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	job := func(p string) sandbox.Job {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		j, err := sandbox.DecodeJob(b)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	cand, grader := job(f.job1), job(f.job2)
	write := func(name string, a sandbox.Assessment) string {
		subjects, err := sandbox.AssessmentSubjects(cand, grader)
		if err != nil {
			t.Fatal(err)
		}
		pred, _ := sandbox.CanonicalJSON(a)
		env, err := s.SignStatement(sandbox.Statement{Type: sandbox.StatementType, Subject: subjects, PredicateType: sandbox.PredicateAssessment, Predicate: pred})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(f.dir, name)
		if err := os.WriteFile(p, env, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := sandbox.Assessment{Schema: sandbox.SignedAssessmentSchema, ManifestDigest: sandbox.DigestBytes([]byte("bundle")), SupervisorRevision: "sandboxd-supervisor/1",
		CandidateJob: cand.ID, CandidateDigest: cand.Digest, GraderJob: grader.ID, GraderDigest: grader.Digest,
		WorkspaceDigest: f.workspace, Verdict: sandbox.VerdictPassed, Reasons: []string{}, ObservationRefs: []sandbox.ObservationRef{},
		Checks: []sandbox.AssessedCheck{{Name: "t", Status: sandbox.VerdictPassed, Evidence: []string{}}}}
	good := write("assessment.json", a)
	a.Checks[0].Status = sandbox.VerdictFailed
	forged := write("forged.json", a)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"pinned key", []string{"--key", pub, good}, exitOK, "ok: assessment: passed (1 checks)"},
		{"bound to its grader job", []string{"--key", pub, "--job", f.job2, good}, exitOK, "bound to"},
		{"another key", []string{"--key", f.pub, good}, exitFailed, "FAILED: unknown_key"},
		{"a verdict better than its checks", []string{"--key", pub, forged}, exitFailed, "FAILED: predicate"},
		{"the verdict expected", []string{"--key", pub, "--expect", "passed", "--bundle", a.ManifestDigest, "--job", f.job1, good}, exitOK, "ok: assessment: passed"},
		{"the verdict expected of the workspace", []string{"--key", pub, "--expect", "passed", "--bundle", a.ManifestDigest, "--workspace", f.workspace, good}, exitOK, "workspace " + f.workspace},
		{"another verdict expected", []string{"--key", pub, "--expect", "failed", "--bundle", a.ManifestDigest, "--job", f.job1, good}, exitFailed, "FAILED: verdict: the signed assessment's verdict is passed"},
		// Without --job or --workspace a pass would be a pass of any jobs;
		// under another bundle or of other jobs it is not the one expected.
		{"expect without a binding", []string{"--key", pub, "--expect", "passed", good}, exitUsage, ""},
		{"expect, another bundle", []string{"--key", pub, "--expect", "passed", "--bundle", f.bundle, "--job", f.job1, good}, exitFailed, "FAILED: bundle_binding: the assessment is about bundle " + a.ManifestDigest},
		{"expect, another workspace", []string{"--key", pub, "--expect", "passed", "--bundle", a.ManifestDigest, "--workspace", f.otherWS, good}, exitFailed, "FAILED: workspace_binding: the assessment is about workspace " + f.workspace},
	} {
		code, out, errOut := runCmd(t, cmdVerify, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, %q %q; want exit %d and %q", tc.name, code, out, errOut, tc.code, tc.want)
		}
	}
}
