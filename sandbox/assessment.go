package sandbox

import (
	"fmt"
	"slices"
	"strings"
)

// PredicateAssessment is the predicate type of a signed assessment: an
// in-toto statement about the candidate and grader jobs whose predicate is
// an Assessment. Every assessment is signed with it, inconclusive ones too;
// a passed or failed one is also signed as an in-toto test-result
// statement (PredicateTestResult).
const PredicateAssessment = "https://sandboxd.dev/attestation/assessment/v1"

// SignedAssessmentSchema is the schema of the Assessment predicate.
const SignedAssessmentSchema = "sandboxd.signed-assessment/v1"

// Verdict is the supervisor's judgement of a check or of a whole run.
type Verdict string

// The verdicts. Inconclusive is never rounded up to passed.
const (
	VerdictPassed       Verdict = "passed"
	VerdictFailed       Verdict = "failed"
	VerdictInconclusive Verdict = "inconclusive"
)

// Valid reports whether v is one of the three verdicts.
func (v Verdict) Valid() bool {
	return v == VerdictPassed || v == VerdictFailed || v == VerdictInconclusive
}

// Assessment is the predicate of a signed assessment: the supervisor's
// verdict bound to the bundle (its manifest digest), the supervisor's
// revision and both exact jobs, with every check's status and the digests
// of the evidence it rests on. Nothing in it comes from a workload's
// stdout or stderr.
type Assessment struct {
	Schema string `json:"schema"`
	// ManifestDigest is the digest of the bundle the grader ran (its OCI
	// manifest), the plan's manifest digest.
	ManifestDigest string `json:"manifest_digest"`
	// Instance is the task instance the bundle names (its bundle.json's
	// instance, fixed by ManifestDigest), "" for none.
	Instance           string `json:"instance,omitempty"`
	SupervisorRevision string `json:"supervisor_revision"`
	// CandidateDigest and GraderDigest are the digests of the two jobs
	// (the same job when the bundle has no candidate command).
	CandidateJob    string  `json:"candidate_job"`
	CandidateDigest string  `json:"candidate_digest"`
	GraderJob       string  `json:"grader_job"`
	GraderDigest    string  `json:"grader_digest"`
	WorkspaceDigest string  `json:"workspace_digest,omitempty"`
	Verdict         Verdict `json:"verdict"`
	// Reasons are the evidence rules that made the run inconclusive.
	Reasons []string        `json:"reasons"`
	Checks  []AssessedCheck `json:"checks"`
	// ObservationRefs are the observations the assessment was computed
	// from: the signed results (by envelope digest), the report artifact,
	// the supervisor's retained assessment.
	ObservationRefs []ObservationRef `json:"observation_refs"`
}

// AssessedCheck is the verdict on one required (or reported) check.
type AssessedCheck struct {
	Name   string  `json:"name"`
	Status Verdict `json:"status"`
	// Reason is the deciding rule and its detail.
	Reason string `json:"reason"`
	// Evidence are the digests of what the status rests on.
	Evidence []string `json:"evidence"`
}

// ObservationRef names one observation by digest.
type ObservationRef struct {
	// Name says what it is: "candidate/result", "grader/result",
	// "grader/report", "supervisor/assessment".
	Name      string `json:"name"`
	Digest    string `json:"digest"`
	MediaType string `json:"media_type"`
}

// Media types of observation refs.
const (
	MediaTypeEnvelope   = "application/vnd.dsse.envelope.v1+json"
	MediaTypeReport     = "application/octet-stream"
	MediaTypeAssessment = "application/vnd.sandboxd.assessment.v1+json"
)

// Validate checks the fields a consumer relies on.
func (a *Assessment) Validate() error {
	if a.Schema != SignedAssessmentSchema {
		return fieldErr("assessment.schema", "unknown schema %q (want %q)", a.Schema, SignedAssessmentSchema)
	}
	for _, d := range []struct{ field, v string }{
		{"manifest_digest", a.ManifestDigest}, {"candidate_digest", a.CandidateDigest}, {"grader_digest", a.GraderDigest},
	} {
		if !ValidDigest(d.v) {
			return fieldErr("assessment."+d.field, "malformed digest %q", d.v)
		}
	}
	if a.WorkspaceDigest != "" && !ValidDigest(a.WorkspaceDigest) {
		return fieldErr("assessment.workspace_digest", "malformed digest %q", a.WorkspaceDigest)
	}
	if a.Instance != "" && !ValidInstance(a.Instance) {
		return fieldErr("assessment.instance", "%q is not an instance id", a.Instance)
	}
	if !validJobID(a.CandidateJob) || !validJobID(a.GraderJob) {
		return fieldErr("assessment.grader_job", "malformed job id")
	}
	if a.SupervisorRevision == "" {
		return fieldErr("assessment.supervisor_revision", "empty")
	}
	if !a.Verdict.Valid() {
		return fieldErr("assessment.verdict", "unknown verdict %q", a.Verdict)
	}
	worst := VerdictPassed
	for i, c := range a.Checks {
		if !c.Status.Valid() {
			return fieldErr(fmt.Sprintf("assessment.checks[%d].status", i), "unknown verdict %q", c.Status)
		}
		for _, d := range c.Evidence {
			if !ValidDigest(d) {
				return fieldErr(fmt.Sprintf("assessment.checks[%d].evidence", i), "malformed digest %q", d)
			}
		}
		switch {
		case c.Status == VerdictInconclusive:
			worst = VerdictInconclusive
		case c.Status == VerdictFailed && worst == VerdictPassed:
			worst = VerdictFailed
		}
	}
	if len(a.Checks) == 0 || len(a.Reasons) > 0 {
		worst = VerdictInconclusive
	}
	// A verdict better than its checks would be a forged summary.
	if rank(a.Verdict) > rank(worst) {
		return fieldErr("assessment.verdict", "%s, but the checks and reasons make it at best %s", a.Verdict, worst)
	}
	for i, r := range a.ObservationRefs {
		if r.Name == "" || !ValidDigest(r.Digest) {
			return fieldErr(fmt.Sprintf("assessment.observation_refs[%d]", i), "needs a name and a digest")
		}
	}
	return nil
}

func rank(v Verdict) int {
	switch v {
	case VerdictPassed:
		return 2
	case VerdictFailed:
		return 1
	}
	return 0
}

// AssessmentSubjects returns the subjects of a signed assessment: the
// candidate job and the grader job ("job:<id>" with the job's digest), one
// subject when they are the same job.
func AssessmentSubjects(candidate, grader Job) ([]Subject, error) {
	s, err := ReceiptSubjects(candidate)
	if err != nil {
		return nil, err
	}
	if candidate.ID == grader.ID && candidate.Digest == grader.Digest {
		return s, nil
	}
	g, err := ReceiptSubjects(grader)
	if err != nil {
		return nil, err
	}
	return append(s, g...), nil
}

// VerifiedAssessment is a signed assessment whose signatures, statement
// and subjects hold; it is not yet bound to jobs the caller knows.
type VerifiedAssessment struct {
	Assessment Assessment
	KeyIDs     []string
	Subjects   []Subject
}

// VerifyAssessmentEnvelope checks a signed assessment on its own, as
// `sandboxd verify` does offline: the envelope's signatures against the
// pinned keys, the statement and predicate types, the predicate (strictly
// decoded and valid: no verdict better than its checks) and that the
// subjects are exactly the two jobs the predicate names.
func VerifyAssessmentEnvelope(keys KeySet, envelope []byte) (VerifiedAssessment, error) {
	env, payload, err := parseEnvelope(envelope)
	if err != nil {
		return VerifiedAssessment{}, err
	}
	if env.PayloadType != InTotoPayloadType {
		return VerifiedAssessment{}, verifyErr(CheckPayloadType, "%q, want %q", env.PayloadType, InTotoPayloadType)
	}
	ids, err := verifySignatures(keys, env, payload)
	if err != nil {
		return VerifiedAssessment{}, err
	}
	var st Statement
	if err := decodeStrict(payload, &st); err != nil {
		return VerifiedAssessment{}, verifyErr(CheckMalformed, "statement: %v", err)
	}
	if st.Type != StatementType {
		return VerifiedAssessment{}, verifyErr(CheckStatementType, "%q, want %q", st.Type, StatementType)
	}
	if st.PredicateType != PredicateAssessment {
		return VerifiedAssessment{}, verifyErr(CheckPredicateType, "%q, want %q", st.PredicateType, PredicateAssessment)
	}
	var a Assessment
	if err := decodeStrict(st.Predicate, &a); err != nil {
		return VerifiedAssessment{}, verifyErr(CheckPredicate, "assessment: %v", err)
	}
	if err := a.Validate(); err != nil {
		return VerifiedAssessment{}, verifyErr(CheckPredicate, "%v", err)
	}
	want, err := AssessmentSubjects(Job{ID: a.CandidateJob, Digest: a.CandidateDigest}, Job{ID: a.GraderJob, Digest: a.GraderDigest})
	if err != nil {
		return VerifiedAssessment{}, verifyErr(CheckPredicate, "%v", err)
	}
	if err := sameSubjects(st.Subject, want); err != nil {
		return VerifiedAssessment{}, err
	}
	return VerifiedAssessment{Assessment: a, KeyIDs: ids, Subjects: st.Subject}, nil
}

// VerifyAssessment verifies a signed assessment (VerifyAssessmentEnvelope)
// and that it is about exactly candidate and grader, sealed jobs, and the
// grader's bundle. It returns the verified assessment.
func VerifyAssessment(keys KeySet, envelope []byte, candidate, grader Job) (Assessment, error) {
	va, err := VerifyAssessmentEnvelope(keys, envelope)
	if err != nil {
		return Assessment{}, err
	}
	a := va.Assessment
	for _, j := range []Job{candidate, grader} {
		if err := j.VerifyDigest(); err != nil {
			return Assessment{}, fmt.Errorf("job to bind to: %w", err)
		}
	}
	if a.CandidateJob != candidate.ID || a.CandidateDigest != candidate.Digest || a.GraderJob != grader.ID || a.GraderDigest != grader.Digest {
		return Assessment{}, verifyErr(CheckJobBinding, "assessment is about candidate %s (%s) and grader %s (%s), not %s (%s) and %s (%s)",
			a.CandidateJob, a.CandidateDigest, a.GraderJob, a.GraderDigest, candidate.ID, candidate.Digest, grader.ID, grader.Digest)
	}
	if grader.Bundle != a.ManifestDigest {
		return Assessment{}, verifyErr(CheckJobBinding, "assessment names bundle %s, the grader job runs %s", a.ManifestDigest, grader.Bundle)
	}
	return a, nil
}

// SortedRefs returns refs sorted by name, then digest.
func SortedRefs(refs []ObservationRef) []ObservationRef {
	out := slices.Clone(refs)
	slices.SortFunc(out, func(x, y ObservationRef) int {
		if c := strings.Compare(x.Name, y.Name); c != 0 {
			return c
		}
		return strings.Compare(x.Digest, y.Digest)
	})
	return out
}
