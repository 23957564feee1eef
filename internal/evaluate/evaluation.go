package evaluate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// An Evaluation is what a bundle prescribes on one runtime, built once
// from the bundle: the jobs of an evaluation of a workspace (the candidate
// job when the bundle has a candidate command, the grader job on what the
// candidate exported), the hand-over of that export, the controls the
// bundle declares, and the judging of a set of verified results. Whoever
// runs or judges an evaluation only supplies results to it: Run
// (`sandboxd run`), the daemon's plan and assess, the evidence check
// (`sandboxd assess`).
type Evaluation struct {
	Manifest     bundle.Manifest
	BundleDigest string
	LayerDigest  string
	Policy       supervisor.Policy
	// Runtime is what the jobs run on (runc or runsc): the host's
	// choice, never the bundle's or the candidate's.
	Runtime string
	// bundle is the verified bundle a control's workspace is rebuilt
	// from (nil when only the bundle's manifest is at hand).
	bundle *bundle.Bundle
}

// New returns the evaluation a bundle's manifest prescribes, its jobs on
// runtime ("" is runc).
func New(m bundle.Manifest, bundleDigest, layerDigest, runtime string) (*Evaluation, error) {
	p, err := PolicyOf(m)
	if err != nil {
		return nil, err
	}
	return &Evaluation{Manifest: m, BundleDigest: bundleDigest, LayerDigest: layerDigest, Policy: p, Runtime: runtimeOr(runtime)}, nil
}

// Of returns the evaluation of a verified bundle, its jobs on runtime.
func Of(b *bundle.Bundle, runtime string) (*Evaluation, error) {
	e, err := New(b.Manifest, b.Digest, b.LayerDigest, runtime)
	if err != nil {
		return nil, err
	}
	e.bundle = b
	return e, nil
}

// On is the same evaluation with its jobs on another runtime: a job is
// judged on the runtime its signed result says it ran on.
func (e *Evaluation) On(runtime string) *Evaluation {
	o := *e
	o.Runtime = runtimeOr(runtime)
	return &o
}

// HasCandidate reports whether the bundle has a candidate command, run as
// a job of its own before the grader; without one the grader grades the
// workspace itself.
func (e *Evaluation) HasCandidate() bool { return e.Manifest.Candidate != nil }

// CandidateJob is the job that runs the bundle's candidate command on a
// workspace (unsealed). It is the only form a candidate job may have:
// whoever judges one rebuilds it and compares digests (SameJob). A bundle
// without a candidate command has none: its argv stays empty, which no
// job validates with.
func (e *Evaluation) CandidateJob(workspace, id string) sandbox.Job {
	var argv []string
	if e.Manifest.Candidate != nil {
		argv = e.Manifest.Candidate.Argv
	}
	return sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: e.Manifest.Image, Bundle: e.BundleDigest,
		Inputs:  []sandbox.Input{{Name: "workspace", Digest: workspace, Path: sandbox.WorkPath, Writable: true}},
		Argv:    argv,
		Env:     map[string]string{"SANDBOXD_EXPORT": ExportPath},
		WorkDir: sandbox.WorkPath, Outputs: []string{ExportPath},
		Limits: e.Manifest.DefaultLimits, Network: sandbox.NetworkNone, Runtime: e.Runtime,
	}
}

// GraderTemplate is the grader job without the candidate's export
// (unsealed): the bundle layer read-only at sandbox.BundlePath, the grader
// command, the report directory as its output. GraderJob, and
// sandbox.GraderJob for a verifier, append the export.
func (e *Evaluation) GraderTemplate(id string) sandbox.Job {
	m := e.Manifest
	return sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: m.Image, Bundle: e.BundleDigest,
		Inputs: []sandbox.Input{{Name: "bundle", Digest: e.LayerDigest, Path: sandbox.BundlePath}},
		Argv:   m.Grader.Argv,
		Env: map[string]string{
			"SANDBOXD_REPORT":    m.Report.Path,
			"SANDBOXD_BUNDLE":    sandbox.BundlePath,
			"SANDBOXD_CANDIDATE": sandbox.CandidateExportPath,
		},
		WorkDir: sandbox.WorkPath, Outputs: []string{path.Dir(m.Report.Path)},
		Limits: m.DefaultLimits, Network: sandbox.NetworkNone, Runtime: e.Runtime,
	}
}

// GraderJob is the job that runs the bundle's grader on an export (the
// candidate job's, or the workspace itself without a candidate command),
// unsealed: GraderTemplate with the export appended read-only at
// sandbox.CandidateExportPath, as sandbox.GraderJob appends it. As for
// CandidateJob, a grader job is judged only if it is exactly this one.
func (e *Evaluation) GraderJob(export, id string) sandbox.Job {
	g := e.GraderTemplate(id)
	g.Inputs = append(g.Inputs, sandbox.Input{Name: sandbox.CandidateExportInput, Digest: export, Path: sandbox.CandidateExportPath})
	return g
}

// Plan is what the evaluation prescribes for a workspace under the ids a
// caller reserved: the sealed candidate job and grader template or,
// without a candidate command, the sealed grader job on the workspace
// itself. They are exactly the jobs Accept takes.
func (e *Evaluation) Plan(workspace, candidateID, graderID string) (sandbox.Plan, error) {
	if !sandbox.ValidDigest(workspace) {
		return sandbox.Plan{}, &sandbox.FieldError{Field: "workspace_digest", Reason: fmt.Sprintf("malformed digest %q", workspace)}
	}
	p := sandbox.Plan{
		ManifestDigest: e.BundleDigest, Instance: e.Manifest.Instance, LayerDigest: e.LayerDigest, Image: e.Manifest.Image, WorkspaceDigest: workspace,
		RequiredChecks: append([]string{}, e.Policy.Required...), AllReported: e.Policy.AllReported,
		ReportFormat: string(e.Policy.Format), ReportPath: e.Policy.ReportPath, SupervisorRevision: supervisor.Revision,
	}
	if !e.HasCandidate() {
		p.Grader = e.GraderJob(workspace, graderID)
	} else {
		if candidateID == graderID {
			return sandbox.Plan{}, &sandbox.FieldError{Field: "candidate_job_id", Reason: "the candidate and grader jobs need ids of their own"}
		}
		c := e.CandidateJob(workspace, candidateID)
		if err := c.Seal(); err != nil {
			return sandbox.Plan{}, fmt.Errorf("candidate job: %w", err)
		}
		p.Candidate = &c
		p.Grader = e.GraderTemplate(graderID)
	}
	if err := p.Grader.Seal(); err != nil {
		return sandbox.Plan{}, fmt.Errorf("grader job: %w", err)
	}
	return p, nil
}

// Export is what a candidate job hands over to the grader.
type Export struct {
	Digest string
	// Refused is why the bundle's reader rules refuse the export ("" when
	// they do not). That is the candidate's doing, so it is evidence
	// (supervisor.RuleCandidateExportRefused fails every check), never an
	// error: the grader is given the export all the same, and whatever it
	// makes of it, the verdict is failed.
	Refused string
}

// Handover builds the candidate job's export from its collected artifacts
// into blobs (ExportOf) and checks it against the bundle's reader rules.
// An export that cannot be built at all is an error wrapping
// ErrCandidateExport.
func (e *Evaluation) Handover(ctx context.Context, blobs *store.Store, candidate sandbox.Result) (Export, error) {
	d, err := ExportOf(ctx, blobs, candidate, e.Manifest.DefaultLimits)
	if err != nil {
		return Export{}, err
	}
	x := Export{Digest: d}
	switch err := CheckRules(blobs, e.Manifest, d); {
	case errors.Is(err, bundle.ErrRefusedPath):
		x.Refused = "candidate export: " + err.Error()
	case err != nil:
		return Export{}, fmt.Errorf("candidate export %s: %w", d, err)
	}
	return x, nil
}

// Ran is a job with its verified result.
type Ran struct {
	Job    sandbox.Job
	Result sandbox.Result
}

// ErrNotPrescribed marks a job that is not the one the evaluation
// prescribes: another command, input, environment, output, limit or id
// than the bundle's, or a workspace or export other than the one judged.
var ErrNotPrescribed = errors.New("not the bundle's job")

// Accept checks that candidate (nil exactly when the bundle has no
// candidate command) and grader are the jobs the evaluation prescribes for
// workspace under their own ids, each on the runtime it ran on: the
// candidate job on the workspace, and the grader on that job's export,
// rebuilt into blobs from its collected artifacts (or, without a candidate
// command, on the workspace, which the reader rules must allow). It
// returns the results to judge; any other job is an error wrapping
// ErrNotPrescribed.
func (e *Evaluation) Accept(ctx context.Context, blobs *store.Store, workspace string, candidate *Ran, grader Ran) (Results, error) {
	r := Results{Workspace: workspace, Grader: grader.Result}
	export := workspace
	switch {
	case !e.HasCandidate() && candidate != nil:
		return Results{}, fmt.Errorf("%w: the bundle has no candidate command; the candidate job must be the grader job %s", ErrNotPrescribed, grader.Job.ID)
	case e.HasCandidate() && candidate == nil:
		return Results{}, fmt.Errorf("%w: the bundle has a candidate command; the grader job cannot be its candidate job", ErrNotPrescribed)
	case candidate != nil:
		if err := SameJob("candidate", candidate.Job, e.On(candidate.Job.Runtime).CandidateJob(workspace, candidate.Job.ID)); err != nil {
			return Results{}, fmt.Errorf("%w: %w", ErrNotPrescribed, err)
		}
		x, err := e.Handover(ctx, blobs, candidate.Result)
		if err != nil {
			return Results{}, fmt.Errorf("%w: candidate job %s: its export cannot be rebuilt: %w", ErrNotPrescribed, candidate.Job.ID, err)
		}
		r.Candidate = &candidate.Result
		export, r.ExportRefused = x.Digest, x.Refused
	default:
		if err := CheckRules(blobs, e.Manifest, workspace); err != nil {
			return Results{}, fmt.Errorf("%w: what the grader was given: %w", ErrNotPrescribed, err)
		}
	}
	if err := SameJob("grader", grader.Job, e.On(grader.Job.Runtime).GraderJob(export, grader.Job.ID)); err != nil {
		return Results{}, fmt.Errorf("%w: %w", ErrNotPrescribed, err)
	}
	return r, nil
}

// Results are one workspace's verified results, as the supervisor judges
// them: the grader's and, when the bundle has a candidate command, the
// candidate job's with the reader rules' word on its export.
type Results struct {
	Workspace     string
	Candidate     *sandbox.Result // nil: the grader graded the workspace itself
	Grader        sandbox.Result
	ExportRefused string // Export.Refused of the candidate's export
}

// Evidence is what the supervisor judges one workspace's results on, under
// the evaluation's policy and with the controls' outcomes.
func (e *Evaluation) Evidence(blobs *store.Store, r Results, controls []supervisor.ControlOutcome) (ev supervisor.Evidence, done func()) {
	return evidenceOf(blobs, e.BundleDigest, e.Manifest.Instance, e.Manifest.Image, e.Policy, r, controls)
}

// evidenceOf builds the supervisor's evidence, with the grader's report
// artifact opened from blobs (left nil when it cannot be opened: the
// supervisor then finds the report unavailable). done closes the report.
// It is the one place the supervisor's evidence is built.
func evidenceOf(blobs *store.Store, bundleDigest, instance, imageID string, p supervisor.Policy, r Results, controls []supervisor.ControlOutcome) (ev supervisor.Evidence, done func()) {
	ev = supervisor.Evidence{
		BundleDigest:       bundleDigest,
		Instance:           instance,
		ImageID:            imageID,
		CandidateJobDigest: r.Grader.JobDigest,
		WorkspaceDigest:    r.Workspace,
		Policy:             p,
		Grader:             r.Grader,
		Controls:           controls,
	}
	if r.Candidate != nil {
		ev.CandidateJobDigest = r.Candidate.JobDigest
		ev.Candidate = r.Candidate
		ev.ExportRefused = r.ExportRefused
	}
	done = func() {}
	if a, ok := r.Grader.Artifact(p.ReportPath); ok {
		if f, err := blobs.Open(a.Digest); err == nil {
			ev.Report = f
			done = func() { f.Close() }
		}
	}
	return ev, done
}

// AssessFunc assesses one evidence: the supervisor's Assess, which
// retains the assessment, or supervisor.Judge for a re-check that keeps
// nothing.
type AssessFunc func(supervisor.Evidence) (supervisor.Assessment, []byte, error)

// Judge judges the results of one run: each control the policy declares
// that has results, alone (its policy without controls), then the
// candidate's with the controls' outcomes. A declared control without
// results is left to the candidate's assessment, which then finds it
// missing.
func (e *Evaluation) Judge(blobs *store.Store, controls map[supervisor.ControlKind]Results, candidate Results, judge AssessFunc) ([]ControlRun, supervisor.Assessment, []byte, error) {
	var runs []ControlRun
	var outcomes []supervisor.ControlOutcome
	alone := e.Policy
	alone.Controls = nil
	for _, kind := range e.Policy.Controls {
		r, ok := controls[kind]
		if !ok {
			continue
		}
		ev, done := evidenceOf(blobs, e.BundleDigest, e.Manifest.Instance, e.Manifest.Image, alone, r, nil)
		a, raw, err := judge(ev)
		done()
		if err != nil {
			return nil, supervisor.Assessment{}, nil, fmt.Errorf("control %s: %w", kind, err)
		}
		runs = append(runs, ControlRun{Kind: kind, WorkspaceDigest: r.Workspace, Assessment: a, AssessmentJSON: raw})
		outcomes = append(outcomes, supervisor.ControlFrom(kind, a, raw))
	}
	ev, done := e.Evidence(blobs, candidate, outcomes)
	defer done()
	a, raw, err := judge(ev)
	if err != nil {
		return nil, supervisor.Assessment{}, nil, err
	}
	return runs, a, raw, nil
}

// ControlWorkspace is the workspace of one of the bundle's controls,
// rebuilt from the bundle's layer into blobs: the only workspace an
// evaluation of that control may have. The layer is the bundle's own
// (Of) or, for an evaluation built from a manifest (New), the one blobs
// holds under LayerDigest (the store checks a blob against its digest).
func (e *Evaluation) ControlWorkspace(ctx context.Context, blobs *store.Store, kind supervisor.ControlKind) (string, error) {
	open := func() (io.ReadCloser, error) {
		f, err := blobs.Open(e.LayerDigest)
		if err != nil {
			return nil, fmt.Errorf("the bundle's layer %s: %w", e.LayerDigest, err)
		}
		return f, nil
	}
	if e.bundle != nil {
		open = e.bundle.OpenLayer
	}
	return controlWorkspace(ctx, blobs, e.Manifest, open, kind)
}
