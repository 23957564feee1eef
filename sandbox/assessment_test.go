package sandbox_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
)

func signedAssessment(t *testing.T, s *receipt.Signer, a sandbox.Assessment, subjects []sandbox.Subject) []byte {
	t.Helper()
	pred, err := sandbox.CanonicalJSON(a)
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.SignStatement(sandbox.Statement{Type: sandbox.StatementType, Subject: subjects, PredicateType: sandbox.PredicateAssessment, Predicate: pred})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A signed assessment verifies only with the pinned key, only for the two
// jobs it names, and only if its verdict is no better than its checks.
func TestVerifyAssessment(t *testing.T) {
	sa, sb := signers(t)
	keys := keySet(t, sa)
	cand, grader, other := newJob(t, "c"), newJob(t, "g"), newJob(t, "o")
	subjects, err := sandbox.AssessmentSubjects(cand, grader)
	if err != nil {
		t.Fatal(err)
	}
	d := func(s string) string { return sandbox.DigestBytes([]byte(s)) }
	good := sandbox.Assessment{
		Schema: sandbox.SignedAssessmentSchema, ManifestDigest: grader.Bundle, SupervisorRevision: "sandboxd-supervisor/1",
		CandidateJob: cand.ID, CandidateDigest: cand.Digest, GraderJob: grader.ID, GraderDigest: grader.Digest,
		Verdict: sandbox.VerdictPassed, Reasons: []string{},
		Checks:          []sandbox.AssessedCheck{{Name: "a", Status: sandbox.VerdictPassed, Reason: "report_passed", Evidence: []string{d("result")}}},
		ObservationRefs: []sandbox.ObservationRef{{Name: "grader/result", Digest: d("env"), MediaType: sandbox.MediaTypeEnvelope}},
	}
	a, err := sandbox.VerifyAssessment(keys, signedAssessment(t, sa, good, subjects), cand, grader)
	if err != nil || a.Verdict != sandbox.VerdictPassed {
		t.Fatalf("a good assessment: %v %v", a.Verdict, err)
	}
	va, err := sandbox.VerifyAssessmentEnvelope(keys, signedAssessment(t, sa, good, subjects))
	if err != nil || len(va.KeyIDs) != 1 {
		t.Fatalf("offline: %v", err)
	}
	named := good
	named.Instance = "astropy__astropy-12907"
	if a, err := sandbox.VerifyAssessment(keys, signedAssessment(t, sa, named, subjects), cand, grader); err != nil || a.Instance != named.Instance {
		t.Errorf("an assessment naming its instance: got %q, %v", a.Instance, err)
	}

	forged := good
	forged.Checks = []sandbox.AssessedCheck{{Name: "a", Status: sandbox.VerdictFailed, Evidence: []string{}}}
	withReason := good
	withReason.Reasons = []string{"report_missing"}
	noChecks := good
	noChecks.Checks = nil
	badInstance := good
	badInstance.Instance = "django/django#123"
	aboutOther := good
	aboutOther.GraderJob, aboutOther.GraderDigest = other.ID, other.Digest
	otherSubjects, _ := sandbox.AssessmentSubjects(cand, other)
	for _, tc := range []struct {
		name string
		env  []byte
		want error
	}{
		{"signed by another key", signedAssessment(t, sb, good, subjects), sandbox.ErrUnknownKey},
		{"passed over a failed check", signedAssessment(t, sa, forged, subjects), sandbox.ErrPredicate},
		{"passed despite a fired rule", signedAssessment(t, sa, withReason, subjects), sandbox.ErrPredicate},
		{"passed without checks", signedAssessment(t, sa, noChecks, subjects), sandbox.ErrPredicate},
		{"an instance that is no instance id", signedAssessment(t, sa, badInstance, subjects), sandbox.ErrPredicate},
		{"subjects of other jobs", signedAssessment(t, sa, good, otherSubjects), sandbox.ErrSubject},
		{"about another grader job", signedAssessment(t, sa, aboutOther, otherSubjects), sandbox.ErrJobBinding},
	} {
		if _, err := sandbox.VerifyAssessment(keys, tc.env, cand, grader); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A receipt is not an assessment.
	rc := mustSign(t)(sa.SignAccepted(cand, goldenFacts, goldenAt))
	if _, err := sandbox.VerifyAssessment(keys, rc, cand, grader); !errors.Is(err, sandbox.ErrPredicateType) {
		t.Errorf("a receipt as an assessment: %v", err)
	}
}

// Authenticity is the verifier's port: exactly the job, the pinned key, and
// decoded values that are their envelopes'.
func TestAuthenticity(t *testing.T) {
	ctx := context.Background()
	sa, sb := signers(t)
	auth, err := sandbox.NewAuthenticity(keySet(t, sa))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.NewAuthenticity(sandbox.KeySet{}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("no pinned key: %v", err)
	}
	signedOf := func(s *receipt.Signer, job sandbox.Job) sandbox.SignedResult {
		rc := mustSign(t)(s.SignAccepted(job, goldenFacts, goldenAt))
		res := newResult(job)
		env := mustSign(t)(s.SignCompleted(res, rc))
		att, err := sandbox.VerifyAttestation(keySet(t, s), rc)
		if err != nil {
			t.Fatal(err)
		}
		verified, err := sandbox.VerifyResult(keySet(t, s), env, job, rc)
		if err != nil {
			t.Fatal(err)
		}
		return sandbox.SignedResult{Result: verified, Envelope: env, Receipt: sandbox.SignedReceipt{Receipt: *att.Receipt, Envelope: rc}}
	}
	j, k := newJob(t, "j"), newJob(t, "k")
	sj, sk := signedOf(sa, j), signedOf(sa, k)
	if err := auth.VerifyResult(ctx, sj, j); err != nil {
		t.Fatalf("its own result: %v", err)
	}
	mixed := sj
	mixed.Receipt = sk.Receipt
	swapped := sj
	swapped.Result.ExitCode = 0
	swapped.Result.Status = sandbox.StatusSucceeded
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"another job's receipt", auth.VerifyReceipt(ctx, sk.Receipt, j), sandbox.ErrJobBinding},
		{"another job's result", auth.VerifyResult(ctx, sk, j), sandbox.ErrJobBinding},
		{"chained to another job's receipt", auth.VerifyResult(ctx, mixed, j), sandbox.ErrJobBinding},
		{"signed by another key", auth.VerifyResult(ctx, signedOf(sb, j), j), sandbox.ErrUnknownKey},
		{"a decoded result that is not the envelope's", auth.VerifyResult(ctx, swapped, j), sandbox.ErrPredicate},
		{"a cancelled context", auth.VerifyReceipt(cancelled, sj.Receipt, j), context.Canceled},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

// WriteTree refuses names that are not clean relative paths, a file used as
// a directory and content that is not what the entry says.
func TestWriteTreeRefuses(t *testing.T) {
	file := func(name, content string) sandbox.TreeEntry {
		return sandbox.TreeEntry{Name: name, Size: int64(len(content)), Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(content)), nil }}
	}
	short := file("a", "abc")
	short.Size = 5
	wrong := file("a", "abc")
	wrong.Digest = sandbox.DigestBytes([]byte("abd"))
	for _, tc := range []struct {
		name    string
		entries []sandbox.TreeEntry
	}{
		{"absolute", []sandbox.TreeEntry{file("/etc/passwd", "x")}},
		{"dot-dot", []sandbox.TreeEntry{file("../x", "x")}},
		{"unclean", []sandbox.TreeEntry{file("a//b", "x")}},
		{"twice", []sandbox.TreeEntry{file("a", "x"), file("a", "x")}},
		{"a file as a directory", []sandbox.TreeEntry{file("a", "x"), file("a/b", "x")}},
		{"short content", []sandbox.TreeEntry{short}},
		{"content of another digest", []sandbox.TreeEntry{wrong}},
	} {
		if _, err := sandbox.WriteTree(io.Discard, tc.entries); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s: %v, want an invalid-input error", tc.name, err)
		}
	}
}
