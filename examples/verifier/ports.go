package verifier

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// The seed's ports, as the seed names them. Their shapes are the seed's;
// where a type differs (sandbox.SignedReceipt for the seed's
// sandbox.Receipt, …) the package doc says why.

// Runner is the seed's sandbox.Runner: dispatch a sealed job under its
// reserved id, wait for it, read its outcome. *client.Client is one.
type Runner interface {
	Submit(ctx context.Context, job sandbox.Job) (sandbox.SignedReceipt, error)
	Wait(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error)
	Result(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error)
}

// SandboxAuthenticity checks pinned broker signatures and the complete job
// binding, never a workload's assertions. *sandbox.Authenticity is one.
type SandboxAuthenticity interface {
	VerifyReceipt(ctx context.Context, r sandbox.SignedReceipt, job sandbox.Job) error
	VerifyResult(ctx context.Context, r sandbox.SignedResult, job sandbox.Job) error
}

// SandboxSupervisor obtains the authoritative judgement outside both
// workloads; a repeated request gets the retained assessment.
// DaemonSupervisor is one.
type SandboxSupervisor interface {
	Assess(ctx context.Context, obs SandboxObservation) (SandboxAssessment, error)
}

var (
	_ Runner              = (*client.Client)(nil)
	_ sandbox.Runner      = Runner(nil)
	_ SandboxAuthenticity = (*sandbox.Authenticity)(nil)
	_ SandboxSupervisor   = (*DaemonSupervisor)(nil)
)

// Blobs moves content-addressed blobs to and from the daemon: the
// workspace, the bundle's layer and the candidate's export up, collected
// artifacts down. *client.Client is one.
type Blobs interface {
	PutBlob(ctx context.Context, digest string, content []byte) error
	Blob(ctx context.Context, digest string, max int64) ([]byte, error)
}

// ErrCallUncertain is the seed's ErrCallUncertain: a dispatch or wait whose
// outcome is unknown. Reconcile by calling EvaluateTests again with the
// same registration (the same reserved ids), never with new ids. It also
// matches sandbox.ErrUncertain.
var ErrCallUncertain = sandbox.NewSentinel("verification: evaluator call uncertain", sandbox.ErrUncertain)

// Status is the seed's verification.Status, reduced to the three outcomes
// of a test evaluation. Inconclusive is never rounded up to passed.
type Status string

const (
	StatusPassed       Status = "passed"
	StatusFailed       Status = "failed"
	StatusInconclusive Status = "inconclusive"
)

// Ref is the seed's evidence.Ref, reduced to what names an observation.
type Ref struct {
	Name      string `json:"name"`
	Digest    string `json:"digest"`
	MediaType string `json:"media_type,omitempty"`
}

// EvaluationManifest is the seed's manifest reduced to what a sandboxd test
// evaluation binds: the bundle (its manifest digest), the supervisor
// revision and the host-selected required checks. Digest seals the rest.
type EvaluationManifest struct {
	SchemaVersion      int      `json:"schema_version"`
	Revision           string   `json:"revision"`
	TestBundle         Ref      `json:"test_bundle"`
	SupervisorRevision string   `json:"supervisor_revision"`
	RequiredChecks     []string `json:"required_checks"`
	Digest             string   `json:"digest"`
}

// SealEvaluationManifest sorts the required checks and sets the digest
// (SHA-256 of the canonical JSON without it).
func SealEvaluationManifest(m EvaluationManifest) (EvaluationManifest, error) {
	m.RequiredChecks = slices.Clone(m.RequiredChecks)
	slices.Sort(m.RequiredChecks)
	m.Digest = ""
	if err := m.validate(); err != nil {
		return EvaluationManifest{}, err
	}
	d, err := sandbox.SealedDigest(&m)
	if err != nil {
		return EvaluationManifest{}, err
	}
	m.Digest = d
	return m, nil
}

func (m *EvaluationManifest) validate() error {
	if m.SchemaVersion != 1 || m.Revision == "" || m.SupervisorRevision == "" {
		return fmt.Errorf("evaluation manifest: %w: schema_version 1, a revision and a supervisor revision are required", sandbox.ErrInvalid)
	}
	if !sandbox.ValidDigest(m.TestBundle.Digest) {
		return fmt.Errorf("evaluation manifest: %w: test bundle digest %q", sandbox.ErrInvalid, m.TestBundle.Digest)
	}
	if len(m.RequiredChecks) == 0 || slices.Contains(m.RequiredChecks, "") || len(slices.Compact(slices.Sorted(slices.Values(m.RequiredChecks)))) != len(m.RequiredChecks) {
		return fmt.Errorf("evaluation manifest: %w: required checks must be non-empty, distinct names", sandbox.ErrInvalid)
	}
	return nil
}

// Validate detects a changed manifest.
func (m EvaluationManifest) Validate() error {
	if err := m.validate(); err != nil {
		return err
	}
	d, err := sandbox.SealedDigest(&m)
	if err != nil {
		return err
	}
	if d != m.Digest || !slices.IsSorted(m.RequiredChecks) {
		return fmt.Errorf("evaluation manifest: %w: digest %s, content hashes to %s", sandbox.ErrInvalid, m.Digest, d)
	}
	return nil
}

// SandboxTestPlan is the seed's: host configuration for one registered
// manifest. Candidate and Grader are sealed under ids the host reserved
// before registration; Grader is the template the candidate's export is
// appended to (sandbox.GraderJob). A bundle without a candidate command
// (a repository instance whose grader applies the patch itself) has the
// zero Candidate (no digest), and Grader is the complete job on the
// workspace.
type SandboxTestPlan struct {
	ManifestDigest string      `json:"manifest_digest"`
	Candidate      sandbox.Job `json:"candidate"`
	Grader         sandbox.Job `json:"grader"`
	// Controls are the jobs of each control the bundle declares (a
	// workspace in the bundle that must pass, one that must fail), in
	// the same form, under ids reserved with the candidate's; run beside
	// the candidate's, their outcomes judged with it. None without.
	Controls []ControlJobs `json:"controls,omitempty"`
}

// ControlJobs are one control's candidate job (the zero job without a
// candidate command) and grader template (or, as it ran, grader job).
type ControlJobs struct {
	Kind      string      `json:"kind"`
	Candidate sandbox.Job `json:"candidate"`
	Grader    sandbox.Job `json:"grader"`
}

// SandboxObservation is the seed's: completed job identities and captured
// references. Stdout and stderr are deliberately absent.
type SandboxObservation struct {
	Manifest EvaluationManifest
	// Candidate is the grader job itself when the bundle has no candidate
	// command.
	Candidate          sandbox.Job
	Grader             sandbox.Job
	CandidateArtifacts []Ref
	GraderArtifacts    []Ref
	// Controls are the controls' jobs as they ran.
	Controls []ControlJobs
}

// SupervisedCheck is the seed's: the supervisor's observation of one check.
type SupervisedCheck struct {
	Name   string
	Status Status
}

// SandboxAssessment is the seed's, plus the instance the bundle names
// ("" for none) and the signed envelope it was read from (verifiable
// offline with `sandboxd verify`).
type SandboxAssessment struct {
	ManifestDigest     string
	Instance           string
	SupervisorRevision string
	CandidateDigest    string
	GraderDigest       string
	Checks             []SupervisedCheck
	ObservationRefs    []Ref
	Envelope           []byte
}

// CheckResult is the seed's evaluator output, with the plan's digest it is
// bound to (the seed's host records it in the report's provenance).
type CheckResult struct {
	ObservationRefs []Ref
	Status          Status
	EvidenceIDs     []string
	Reason          string
	PlanDigest      string
}

// TestRequest selects a registered manifest, never candidate commands.
type TestRequest struct {
	ManifestDigest string
}

// isUncertain reports whether err leaves a call's outcome unknown.
func isUncertain(ctx context.Context, err error) bool {
	return errors.Is(err, sandbox.ErrUncertain) || ctx.Err() != nil
}
