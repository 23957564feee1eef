package evaluate

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Judged names the two jobs an assessment judged and their signed results,
// the observations it rests on.
type Judged struct {
	Candidate, Grader             sandbox.Job
	CandidateResult, GraderResult []byte // completed envelopes
	// Controls are the controls' judged jobs, by kind: the signed
	// assessment names their results beside the control's own
	// assessment, whose verdict the candidate's was judged with.
	Controls map[supervisor.ControlKind]Judged
}

// PublicAssessment is the predicate of the signed assessment: the fields a
// verifier relies on, from the supervisor's assessment (retained as raw).
func PublicAssessment(a supervisor.Assessment, raw []byte, j Judged) (sandbox.Assessment, error) {
	refs := []sandbox.ObservationRef{{Name: "supervisor/assessment", Digest: sandbox.DigestBytes(raw), MediaType: sandbox.MediaTypeAssessment}}
	for _, r := range []struct {
		name string
		env  []byte
	}{{"grader/result", j.GraderResult}, {"candidate/result", j.CandidateResult}} {
		if r.env == nil || (r.name == "candidate/result" && j.Candidate.Digest == j.Grader.Digest) {
			continue
		}
		d, err := sandbox.EnvelopeDigest(r.env)
		if err != nil {
			return sandbox.Assessment{}, fmt.Errorf("%s: %w", r.name, err)
		}
		refs = append(refs, sandbox.ObservationRef{Name: r.name, Digest: d, MediaType: sandbox.MediaTypeEnvelope})
	}
	for _, c := range a.Controls {
		refs = append(refs, sandbox.ObservationRef{Name: string(c.Kind) + "/assessment", Digest: c.Assessment, MediaType: sandbox.MediaTypeAssessment})
		cj := j.Controls[c.Kind]
		for _, r := range []struct {
			name string
			env  []byte
		}{{"grader/result", cj.GraderResult}, {"candidate/result", cj.CandidateResult}} {
			if r.env == nil || (r.name == "candidate/result" && cj.Candidate.Digest == cj.Grader.Digest) {
				continue
			}
			d, err := sandbox.EnvelopeDigest(r.env)
			if err != nil {
				return sandbox.Assessment{}, fmt.Errorf("%s/%s: %w", c.Kind, r.name, err)
			}
			refs = append(refs, sandbox.ObservationRef{Name: string(c.Kind) + "/" + r.name, Digest: d, MediaType: sandbox.MediaTypeEnvelope})
		}
	}
	if a.Report.Digest != "" {
		refs = append(refs, sandbox.ObservationRef{Name: "grader/report", Digest: a.Report.Digest, MediaType: sandbox.MediaTypeReport})
	}
	checks := make([]sandbox.AssessedCheck, 0, len(a.Checks))
	for _, c := range a.Checks {
		c.Evidence = append([]string{}, c.Evidence...)
		checks = append(checks, c)
	}
	pa := sandbox.Assessment{
		Schema:             sandbox.SignedAssessmentSchema,
		ManifestDigest:     a.Binding.BundleDigest,
		Instance:           a.Binding.Instance,
		SupervisorRevision: a.SupervisorRevision,
		CandidateJob:       j.Candidate.ID,
		CandidateDigest:    j.Candidate.Digest,
		GraderJob:          j.Grader.ID,
		GraderDigest:       j.Grader.Digest,
		WorkspaceDigest:    a.Binding.WorkspaceDigest,
		Verdict:            a.Verdict,
		Reasons:            append([]string{}, a.Reasons...),
		Checks:             checks,
		ObservationRefs:    sandbox.SortedRefs(refs),
	}
	if pa.CandidateDigest != a.Binding.CandidateJobDigest || pa.GraderDigest != a.Binding.GraderJobDigest || pa.ManifestDigest != j.Grader.Bundle {
		return sandbox.Assessment{}, fmt.Errorf("assessment: %w: its binding is not the judged jobs'", sandbox.ErrInvalid)
	}
	if err := pa.Validate(); err != nil {
		return sandbox.Assessment{}, err
	}
	return pa, nil
}

// SignAssessment returns the signed assessment of a retained assessment,
// the canonical JSON of a sandbox.AssessResponse: the assessment statement
// (PredicateAssessment, about both jobs) and, unless inconclusive, the
// in-toto test-result statement. It is made once per assessment and key
// and retained by the supervisor, so the same assessment always comes back
// as the same bytes.
func SignAssessment(ctx context.Context, sup *supervisor.Supervisor, signer *receipt.Signer, a supervisor.Assessment, raw []byte, j Judged) ([]byte, error) {
	return sup.RetainSigned(ctx, a, signer.KeyID(), func() ([]byte, error) {
		pa, err := PublicAssessment(a, raw, j)
		if err != nil {
			return nil, err
		}
		subjects, err := sandbox.AssessmentSubjects(j.Candidate, j.Grader)
		if err != nil {
			return nil, err
		}
		pred, err := sandbox.CanonicalJSON(pa)
		if err != nil {
			return nil, err
		}
		env, err := signer.SignStatement(sandbox.Statement{Type: sandbox.StatementType, Subject: subjects, PredicateType: sandbox.PredicateAssessment, Predicate: pred})
		if err != nil {
			return nil, err
		}
		resp := sandbox.AssessResponse{Assessment: env}
		if a.Verdict != supervisor.Inconclusive {
			st, err := a.StatementJSON()
			if err != nil {
				return nil, fmt.Errorf("test-result statement: %w", err)
			}
			if resp.TestResult, err = signer.SignPayload(st); err != nil {
				return nil, err
			}
		}
		return sandbox.CanonicalJSON(resp)
	})
}
