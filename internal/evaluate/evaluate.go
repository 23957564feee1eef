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
	"sync"
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
	// Parallel is how many workspaces of a run (each control's, the
	// candidate's) have their jobs run at once; 0 is all of them. The
	// Broker must take concurrent Run calls.
	Parallel int
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

// Run evaluates the workspace against the bundle: each control the bundle
// declares on its own workspace, then the candidate's, each job signed and
// its result verified, then the supervisor's judgement of them all, and,
// unless inconclusive, the signed test-result statement.
func Run(ctx context.Context, d Deps, req Request) (*Outcome, error) {
	if req.RunID == "" {
		var r [6]byte
		rand.Read(r[:])
		req.RunID = "run-" + hex.EncodeToString(r[:])
	}
	e, err := Of(req.Bundle, req.Runtime)
	if err != nil {
		return nil, err
	}
	out := &Outcome{RunID: req.RunID}
	// The workspaces of a run: each declared control's, rebuilt from the
	// bundle, then the candidate's.
	var runs []*workspaceRun
	for _, kind := range e.Policy.Controls {
		step := progress.Start(d.Progress, fmt.Sprintf("control %s: extracting %s from the bundle", kind, ControlDir(e.Manifest, kind)))
		ws, err := e.ControlWorkspace(ctx, d.Blobs, kind)
		step.End(outcome(err))
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		runs = append(runs, &workspaceRun{control: string(kind), workspace: ws})
	}
	runs = append(runs, &workspaceRun{workspace: req.WorkspaceDigest})
	if err := d.runWorkspaces(ctx, out.RunID, e, runs); err != nil {
		return nil, err
	}
	controls := map[supervisor.ControlKind]Results{}
	for _, w := range runs {
		out.Jobs = append(out.Jobs, w.jobs...)
		if w.control != "" {
			controls[supervisor.ControlKind(w.control)] = w.results
		}
	}
	r := runs[len(runs)-1].results
	judge := func(ev supervisor.Evidence) (supervisor.Assessment, []byte, error) {
		step := progress.Start(d.Progress, "assessing "+ev.Grader.JobID)
		a, raw, err := d.Supervisor.Assess(ctx, ev)
		step.End(outcome(err))
		if err != nil {
			return supervisor.Assessment{}, nil, fmt.Errorf("assess: %w", err)
		}
		return a, raw, nil
	}
	var a supervisor.Assessment
	var raw []byte
	out.Controls, a, raw, err = e.Judge(d.Blobs, controls, r, judge)
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

// workspaceRun is one workspace of a run: its control ("" for the
// candidate's own), and once run, its jobs and results.
type workspaceRun struct {
	control, workspace string
	jobs               []JobRecord
	results            Results
}

// runWorkspaces runs the workspaces' jobs, up to d.Parallel workspaces at
// once (all of them when 0): each workspace's jobs depend on each other
// (the grader on the candidate's export), the workspaces do not. The
// first failure cancels the others and is the error returned.
func (d Deps) runWorkspaces(ctx context.Context, runID string, e *Evaluation, runs []*workspaceRun) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	limit := d.Parallel
	if limit <= 0 || limit > len(runs) {
		limit = len(runs)
	}
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for _, w := range runs {
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-slots }()
			err := d.runWorkspace(ctx, runID, e, w)
			if err != nil && w.control != "" {
				err = fmt.Errorf("control %s: %w", w.control, err)
			}
			if err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// runWorkspace runs the jobs of one workspace under the run's ids: the
// candidate job (if the bundle has a candidate command), then the grader
// on what it handed over, or on the workspace itself.
func (d Deps) runWorkspace(ctx context.Context, runID string, e *Evaluation, w *workspaceRun) error {
	if err := CheckRules(d.Blobs, e.Manifest, w.workspace); err != nil {
		return fmt.Errorf("workspace %s: %w", w.workspace, err)
	}
	w.results = Results{Workspace: w.workspace}
	export := w.workspace
	if e.HasCandidate() {
		rec, err := d.runJob(ctx, Role(w.control, RoleCandidate), e.CandidateJob(w.workspace, JobID(runID, w.control, RoleCandidate)))
		if err != nil {
			return err
		}
		w.jobs = append(w.jobs, *rec)
		x, err := e.Handover(ctx, d.Blobs, rec.Result)
		if err != nil {
			return err
		}
		w.results.Candidate, w.results.ExportRefused, export = &rec.Result, x.Refused, x.Digest
	}
	grader, err := d.runJob(ctx, Role(w.control, RoleGrader), e.GraderJob(export, JobID(runID, w.control, RoleGrader)))
	if err != nil {
		return err
	}
	w.jobs = append(w.jobs, *grader)
	w.results.Grader = grader.Result
	return nil
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
	// Whatever the broker collected must fit, or a candidate could make
	// its export unbuildable (and its verdict inconclusive): an artifact
	// path has at most sandbox.MaxArtifactPathBytes, so at most half as
	// many components, each a directory of the export.
	lim := bundle.DefaultLimits()
	lim.MaxDepth = max(lim.MaxDepth, sandbox.MaxArtifactPathBytes/2)
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

// controlWorkspace re-roots a control's directory of the bundle's layer as
// a workspace of its own, ingests it into blobs and returns its digest.
func controlWorkspace(ctx context.Context, blobs *store.Store, m bundle.Manifest, openLayer func() (io.ReadCloser, error), kind supervisor.ControlKind) (string, error) {
	dir := ControlDir(m, kind)
	if dir == "" {
		return "", fmt.Errorf("the bundle declares no %s control: %w", kind, sandbox.ErrInvalid)
	}
	layer, err := openLayer()
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
