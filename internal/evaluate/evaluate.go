package evaluate

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// ExportPath is where a candidate job leaves what the grader should see.
const ExportPath = sandbox.ExportPath

// Broker is what an evaluation needs of the broker (*broker.Broker): the
// runtime facts a receipt records, and running one sealed job to its
// result. Declared here, so that what judges evaluations never links the
// broker or the engine.
type Broker interface {
	Facts(ctx context.Context) (sandbox.RuntimeFacts, error)
	Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error)
}

// Deps are the long-lived pieces an evaluation uses.
type Deps struct {
	Broker     Broker
	Blobs      *store.Store
	Signer     *receipt.Signer
	Supervisor *supervisor.Supervisor
	// Progress is told the evaluation's own steps (extracting a control's
	// workspace, assessing); a job's steps are the Broker's to report.
	// Nil is quiet.
	Progress progress.Reporter
}

// Request names what to evaluate. The bundle must have been verified and
// its layer copied into Deps.Blobs; the workspace ingested into Deps.Blobs.
type Request struct {
	RunID           string // prefix of the job ids; random when empty
	Bundle          *bundle.Bundle
	WorkspaceDigest string
	// Runtime is what every job of the evaluation runs on: runc ("" too)
	// or runsc, as the host's policy allows.
	Runtime string
}

// JobRecord is one job of an evaluation with its signed envelopes.
type JobRecord struct {
	Role           string // candidate, grader, known-good/grader, …
	Job            sandbox.Job
	Result         sandbox.Result // as verified from ResultEnvelope
	Receipt        []byte         // accepted envelope
	ResultEnvelope []byte         // completed envelope
}

// Outcome is an evaluation's evidence.
type Outcome struct {
	RunID          string
	Assessment     supervisor.Assessment
	AssessmentJSON []byte
	// Statement is the signed in-toto test-result envelope; nil when the
	// assessment is inconclusive (it is never PASSED then).
	Statement []byte
	Jobs      []JobRecord
	Controls  []ControlRun
}

// ControlRun is one control workspace's own evaluation.
type ControlRun struct {
	Kind            supervisor.ControlKind
	WorkspaceDigest string
	Assessment      supervisor.Assessment
	AssessmentJSON  []byte
}

// ErrInfrastructure marks an evaluation that could not produce evidence
// because the broker or the engine failed.
var ErrInfrastructure = errors.New("infrastructure error")

// Run evaluates the workspace against the bundle.
func Run(ctx context.Context, d Deps, req Request) (*Outcome, error) {
	if req.RunID == "" {
		var r [6]byte
		rand.Read(r[:])
		req.RunID = "run-" + hex.EncodeToString(r[:])
	}
	m := req.Bundle.Manifest
	out := &Outcome{RunID: req.RunID}
	policy, err := PolicyOf(m)
	if err != nil {
		return nil, err
	}

	controls := map[supervisor.ControlKind]Evaluation{}
	for _, kind := range policy.Controls {
		step := progress.Start(d.Progress, fmt.Sprintf("control %s: extracting %s from the bundle", kind, ControlDir(m, kind)))
		ws, err := ControlWorkspace(ctx, d.Blobs, req.Bundle, kind)
		step.End(outcome(err))
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		ev, err := d.runEvaluation(ctx, out, req, string(kind), ws)
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		controls[kind] = ev
	}
	ev, err := d.runEvaluation(ctx, out, req, "", req.WorkspaceDigest)
	if err != nil {
		return nil, err
	}
	judge := func(e supervisor.Evidence) (supervisor.Assessment, []byte, error) {
		step := progress.Start(d.Progress, "assessing "+e.Grader.JobID)
		a, raw, err := d.Supervisor.Assess(ctx, e)
		step.End(outcome(err))
		if err != nil {
			return supervisor.Assessment{}, nil, fmt.Errorf("assess: %w", err)
		}
		return a, raw, nil
	}
	var a supervisor.Assessment
	var raw []byte
	out.Controls, a, raw, err = AssessRun(d.Blobs, req.Bundle.Digest, m.Image, policy, controls, ev, judge)
	if err != nil {
		return nil, err
	}
	out.Assessment, out.AssessmentJSON = a, raw
	if a.Verdict != supervisor.Inconclusive {
		st, err := a.StatementJSON()
		if err != nil {
			return nil, fmt.Errorf("test-result statement: %w", err)
		}
		if out.Statement, err = d.Signer.SignPayload(st); err != nil {
			return nil, fmt.Errorf("sign test-result statement: %w", err)
		}
	}
	return out, nil
}

// PolicyOf is the supervisor policy a bundle declares.
func PolicyOf(m bundle.Manifest) (supervisor.Policy, error) {
	p := supervisor.Policy{
		Format:      supervisor.Format(m.Report.Format),
		ReportPath:  m.Report.Path,
		Required:    m.RequiredChecks,
		AllReported: m.AllReported,
	}
	if m.Controls != nil {
		if m.Controls.KnownGood != "" {
			p.Controls = append(p.Controls, supervisor.ControlKnownGood)
		}
		if m.Controls.KnownBad != "" {
			p.Controls = append(p.Controls, supervisor.ControlKnownBad)
		}
	}
	if dir := path.Dir(m.Report.Path); dir == sandbox.WorkPath || dir == sandbox.TmpPath {
		return p, fmt.Errorf("bundle.json: report.path %q must be inside a directory below %s or %s: %w", m.Report.Path, sandbox.WorkPath, sandbox.TmpPath, sandbox.ErrInvalid)
	}
	return p, p.Validate()
}

// outcome is how a step ended.
func outcome(err error) string {
	if err != nil {
		return "failed"
	}
	return "done"
}

// runEvaluation runs the candidate job (if declared) and the grader job
// for one workspace.
func (d Deps) runEvaluation(ctx context.Context, out *Outcome, req Request, control, workspace string) (Evaluation, error) {
	m := req.Bundle.Manifest
	ev := Evaluation{Workspace: workspace}
	export := workspace
	if err := CheckRules(d.Blobs, m, workspace); err != nil {
		return Evaluation{}, fmt.Errorf("workspace %s: %w", workspace, err)
	}
	if m.Candidate != nil {
		rec, err := d.runJob(ctx, Role(control, RoleCandidate), CandidateJob(m, req.Bundle.Digest, workspace, JobID(req.RunID, control, RoleCandidate), req.Runtime))
		if err != nil {
			return Evaluation{}, err
		}
		out.Jobs = append(out.Jobs, *rec)
		ev.Candidate = &rec.Result
		if export, err = ExportOf(ctx, d.Blobs, rec.Result, m.DefaultLimits); err != nil {
			return Evaluation{}, fmt.Errorf("candidate export: %w", err)
		}
		if err := CheckRules(d.Blobs, m, export); err != nil {
			return Evaluation{}, fmt.Errorf("candidate export: %w: %w", ErrCandidateExport, err)
		}
	}
	g := GraderJob(m, req.Bundle.Digest, req.Bundle.LayerDigest, export, JobID(req.RunID, control, RoleGrader), req.Runtime)
	grader, err := d.runJob(ctx, Role(control, RoleGrader), g)
	if err != nil {
		return Evaluation{}, err
	}
	out.Jobs = append(out.Jobs, *grader)
	ev.Grader = grader.Result
	return ev, nil
}

// The two jobs of an evaluation.
const (
	RoleCandidate = "candidate"
	RoleGrader    = "grader"
)

// Role names a job of an evaluation: "grader" for the candidate's own,
// "known-good/grader" for a control's.
func Role(control, role string) string {
	if control == "" {
		return role
	}
	return control + "/" + role
}

// JobID is the id of a job of a run: RUN-grader, RUN-known-good-candidate.
func JobID(runID, control, role string) string {
	if control == "" {
		return runID + "-" + role
	}
	return runID + "-" + control + "-" + role
}

// ParseJobID is JobID's inverse: the run, control ("" for the candidate's
// own) and role of a job id of a run. A job id is signed with its job, so
// whoever judges evidence takes a job's role from it, never from an
// unsigned listing.
func ParseJobID(id string) (runID, control, role string, ok bool) {
	for _, c := range []supervisor.ControlKind{supervisor.ControlKnownGood, supervisor.ControlKnownBad, ""} {
		for _, r := range []string{RoleCandidate, RoleGrader} {
			if run, found := strings.CutSuffix(id, JobID("", string(c), r)); found && run != "" {
				return run, string(c), r, true
			}
		}
	}
	return "", "", "", false
}

// Evaluation is one workspace's judged jobs: the grader's result and, when
// the bundle has a candidate command, the candidate job's.
type Evaluation struct {
	Workspace string
	Candidate *sandbox.Result // nil: the grader graded the workspace itself
	Grader    sandbox.Result
}

// Evidence is what the supervisor judges one evaluation on, with the
// grader's report artifact opened from blobs (left nil when it cannot be
// opened: the supervisor then finds the report unavailable). done closes
// the report. It is the one place the supervisor's evidence is built.
func Evidence(blobs *store.Store, bundleDigest, imageID string, p supervisor.Policy, e Evaluation, controls []supervisor.ControlOutcome) (ev supervisor.Evidence, done func()) {
	ev = supervisor.Evidence{
		BundleDigest:       bundleDigest,
		ImageID:            imageID,
		CandidateJobDigest: e.Grader.JobDigest,
		WorkspaceDigest:    e.Workspace,
		Policy:             p,
		Grader:             e.Grader,
		Controls:           controls,
	}
	if e.Candidate != nil {
		ev.CandidateJobDigest = e.Candidate.JobDigest
		ev.Candidate = e.Candidate
	}
	done = func() {}
	if a, ok := e.Grader.Artifact(p.ReportPath); ok {
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

// AssessRun judges the evaluations of one run: each control the policy
// declares that has an evaluation, alone (its policy without controls),
// then the candidate's with the controls' outcomes. A declared control
// without an evaluation is left to the candidate's assessment, which then
// finds it missing.
func AssessRun(blobs *store.Store, bundleDigest, imageID string, p supervisor.Policy, controls map[supervisor.ControlKind]Evaluation, candidate Evaluation, judge AssessFunc) ([]ControlRun, supervisor.Assessment, []byte, error) {
	var runs []ControlRun
	var outcomes []supervisor.ControlOutcome
	cp := p
	cp.Controls = nil
	for _, kind := range p.Controls {
		e, ok := controls[kind]
		if !ok {
			continue
		}
		ev, done := Evidence(blobs, bundleDigest, imageID, cp, e, nil)
		a, raw, err := judge(ev)
		done()
		if err != nil {
			return nil, supervisor.Assessment{}, nil, fmt.Errorf("control %s: %w", kind, err)
		}
		runs = append(runs, ControlRun{Kind: kind, WorkspaceDigest: e.Workspace, Assessment: a, AssessmentJSON: raw})
		outcomes = append(outcomes, supervisor.ControlFrom(kind, a, raw))
	}
	ev, done := Evidence(blobs, bundleDigest, imageID, p, candidate, outcomes)
	defer done()
	a, raw, err := judge(ev)
	if err != nil {
		return nil, supervisor.Assessment{}, nil, err
	}
	return runs, a, raw, nil
}

// CandidateJob is the job that runs a bundle's candidate command on a
// workspace (unsealed), on runtime (runc or runsc; "" is runc: the host's
// policy chooses it, never the bundle or the candidate). It is the only
// form a candidate job of an evaluation may have: whoever judges one
// rebuilds it and compares digests.
func CandidateJob(m bundle.Manifest, bundleDigest, workspace, id, runtime string) sandbox.Job {
	var argv []string // a bundle without a candidate command has no candidate job: argv stays empty, which no job validates with
	if m.Candidate != nil {
		argv = m.Candidate.Argv
	}
	return sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: m.Image, Bundle: bundleDigest,
		Inputs:  []sandbox.Input{{Name: "workspace", Digest: workspace, Path: sandbox.WorkPath, Writable: true}},
		Argv:    argv,
		Env:     map[string]string{"SANDBOXD_EXPORT": ExportPath},
		WorkDir: sandbox.WorkPath, Outputs: []string{ExportPath},
		Limits: m.DefaultLimits, Network: sandbox.NetworkNone, Runtime: runtimeOr(runtime),
	}
}

// GraderJob is the job that runs a bundle's grader on an export (unsealed),
// with the bundle layer and the export read-only: the grader template with
// the export appended at sandbox.CandidateExportPath, as sandbox.GraderJob
// appends it. As for CandidateJob, a grader job is judged only if it is
// exactly this one. It runs on runtime, as CandidateJob does.
func GraderJob(m bundle.Manifest, bundleDigest, layerDigest, export, id, runtime string) sandbox.Job {
	g := GraderTemplate(m, bundleDigest, layerDigest, id, runtime)
	g.Inputs = append(g.Inputs, sandbox.Input{Name: sandbox.CandidateExportInput, Digest: export, Path: sandbox.CandidateExportPath})
	return g
}

func runtimeOr(r string) string {
	if r == "" {
		return sandbox.RuntimeRunc
	}
	return r
}

// SameJob reports whether a journaled or evidence job is exactly the
// expected one (role names it in the error): sealed, it has the same digest.
func SameJob(role string, got, want sandbox.Job) error {
	if err := want.Seal(); err != nil {
		return fmt.Errorf("expected %s job %s: %w", role, want.ID, err)
	}
	if got.Digest != want.Digest {
		return fmt.Errorf("job %s (%s) is not the bundle's %s job (%s): its command, inputs, environment, outputs or limits differ", got.ID, got.Digest, role, want.Digest)
	}
	return nil
}

// runJob signs the receipt, runs the job, signs the result, and verifies
// both envelopes against the signer's own public key before use.
func (d Deps) runJob(ctx context.Context, role string, j sandbox.Job) (*JobRecord, error) {
	if err := j.Seal(); err != nil {
		return nil, err
	}
	facts, err := d.Broker.Facts(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInfrastructure, err)
	}
	rcpt, err := d.Signer.SignAccepted(j, facts, time.Now().UTC())
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	res, err := d.Broker.Run(ctx, j)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrImageRefused) || errors.Is(err, sandbox.ErrConflict) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrInfrastructure, err)
	}
	renv, err := d.Signer.SignCompleted(res, rcpt)
	if err != nil {
		return nil, fmt.Errorf("sign result: %w", err)
	}
	keys, err := sandbox.ParseKeySet(d.Signer.PublicKeyPEM())
	if err != nil {
		return nil, err
	}
	if _, err := sandbox.VerifyReceipt(keys, rcpt, j); err != nil {
		return nil, fmt.Errorf("verify own receipt: %w", err)
	}
	verified, err := sandbox.VerifyResult(keys, renv, j, rcpt)
	if err != nil {
		return nil, fmt.Errorf("verify own result: %w", err)
	}
	return &JobRecord{Role: role, Job: j, Result: verified, Receipt: rcpt, ResultEnvelope: renv}, nil
}

// ExportOf builds the canonical tar of a candidate job's export from its
// collected artifacts (paths re-rooted below ExportPath), streaming: the
// export is never held in memory. Its ceilings are the candidate job's own
// output limits, so what the broker collected always fits.
func ExportOf(ctx context.Context, blobs *store.Store, res sandbox.Result, l sandbox.Limits) (string, error) {
	pr, pw := io.Pipe()
	go func() {
		// The one definition of the export, the verifier's too; the
		// reader rules below then apply to what it wrote.
		_, err := sandbox.WriteCandidateExport(pw, res, func(a sandbox.Artifact) (io.ReadCloser, error) { return blobs.Open(a.Digest) })
		pw.CloseWithError(err)
	}()
	lim := bundle.DefaultLimits()
	lim.MaxBytes = max(lim.MaxBytes, l.OutputBytes)
	lim.MaxFiles = max(lim.MaxFiles, l.FileCount*int64(lim.MaxDepth+1)+1)
	sum, err := bundle.IngestTar(ctx, blobs, pr, bundle.Options{Limits: lim})
	pr.CloseWithError(errors.New("export ingested"))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrCandidateExport, err)
	}
	return sum.Digest, nil
}

// CheckRules refuses a stored workspace or export that holds a path the
// bundle's workspace rules refuse (bundle.ErrRefusedPath): what a grader
// is given must satisfy them, whoever ingested it.
func CheckRules(blobs *store.Store, m bundle.Manifest, digest string) error {
	refuse := m.Refused()
	if len(refuse) == 0 {
		return nil
	}
	f, err := blobs.Open(digest)
	if err != nil {
		return err
	}
	defer f.Close()
	return bundle.CheckRefused(f, refuse)
}

// ErrCandidateExport marks a candidate export the reader rules refuse: the
// candidate's doing, never bad input from the caller.
var ErrCandidateExport = errors.New("candidate export refused")

// ControlDir is the directory of the bundle's layer that holds a control's
// workspace ("" when the bundle declares no such control).
func ControlDir(m bundle.Manifest, kind supervisor.ControlKind) string {
	if m.Controls == nil {
		return ""
	}
	switch kind {
	case supervisor.ControlKnownGood:
		return m.Controls.KnownGood
	case supervisor.ControlKnownBad:
		return m.Controls.KnownBad
	}
	return ""
}

// ControlWorkspace re-roots a control's directory of the bundle's layer as
// a workspace of its own, ingests it into blobs and returns its digest:
// the only workspace an evaluation of that control may have.
func ControlWorkspace(ctx context.Context, blobs *store.Store, b *bundle.Bundle, kind supervisor.ControlKind) (string, error) {
	dir := ControlDir(b.Manifest, kind)
	if dir == "" {
		return "", fmt.Errorf("the bundle declares no %s control: %w", kind, sandbox.ErrInvalid)
	}
	layer, err := b.OpenLayer()
	if err != nil {
		return "", err
	}
	defer layer.Close()
	prefix := strings.TrimSuffix(dir, "/") + "/"
	pr, pw := io.Pipe()
	go func() {
		tr := tar.NewReader(layer)
		tw := tar.NewWriter(pw)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				pw.CloseWithError(tw.Close())
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			rel, ok := strings.CutPrefix(h.Name, prefix)
			if !ok || rel == "" {
				continue
			}
			h.Name = rel
			if err := tw.WriteHeader(h); err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := io.Copy(tw, tr); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	sum, err := bundle.IngestTar(ctx, blobs, pr, bundle.Options{})
	pr.CloseWithError(errors.New("done"))
	if err != nil {
		return "", err
	}
	return sum.Digest, nil
}
