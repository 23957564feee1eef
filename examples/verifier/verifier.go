package verifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Registration is one registered plan: the host's manifest, the plan under
// ids the host reserved (and recorded durably) before registering, and
// what the daemon said the bundle prescribes. It is frozen by
// NewSandboxTestVerifier.
type Registration struct {
	Manifest EvaluationManifest `json:"manifest"`
	Plan     SandboxTestPlan    `json:"plan"`
	// Bundle is the daemon's answer for the bundle (sandbox.Plan): what
	// the bundle requires, the jobs it prescribes.
	Bundle sandbox.Plan `json:"bundle"`
	// Workspace is the candidate workspace's digest.
	Workspace string `json:"workspace"`
	// CandidateRoot is the host directory the workspace was read from, and
	// OutputDir the one this verifier writes its evidence to: never inside
	// the candidate's root.
	CandidateRoot string `json:"candidate_root"`
	OutputDir     string `json:"output_dir"`
}

// PlanDigest is the digest the check result is bound to: the SHA-256 of
// the canonical JSON of the whole registration.
func (r *Registration) PlanDigest() (string, error) {
	canon, err := sandbox.CanonicalJSON(r)
	if err != nil {
		return "", err
	}
	return sandbox.DigestBytes(canon), nil
}

// ErrPlanRefused marks a registration refused before anything ran.
var ErrPlanRefused = sandbox.NewSentinel("plan refused", sandbox.ErrInvalid)

// ValidateSandboxTestPlan checks a registration before anything runs: the
// manifest sealed; the plan, the manifest, both jobs and the daemon's
// answer all about the same bundle; the required checks exactly the
// bundle's (not a subset: a change of the bundle's required surface must be
// acknowledged); the plan's jobs exactly the ones the bundle prescribes,
// sealed under distinct reserved ids, the candidate on the registered
// workspace (without a candidate command, the grader job on it); the
// grader template leaving the candidate export's place free; each
// declared control's jobs likewise, on the control's workspace; the
// output directory outside the candidate's root.
func ValidateSandboxTestPlan(r Registration) error {
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrPlanRefused}, a...)...)
	}
	m, p, b := r.Manifest, r.Plan, r.Bundle
	if err := m.Validate(); err != nil {
		return refuse("%v", err)
	}
	if p.ManifestDigest != m.Digest {
		return refuse("the plan is for manifest %s, not %s", p.ManifestDigest, m.Digest)
	}
	if b.ManifestDigest != m.TestBundle.Digest || b.SupervisorRevision != m.SupervisorRevision {
		return refuse("the bundle answer is for %s under %s, the manifest pins %s under %s", b.ManifestDigest, b.SupervisorRevision, m.TestBundle.Digest, m.SupervisorRevision)
	}
	if b.AllReported {
		return refuse("the bundle judges every reported check; a plan needs its required checks named")
	}
	bundleChecks := slices.Sorted(slices.Values(b.RequiredChecks))
	if !slices.Equal(bundleChecks, m.RequiredChecks) {
		return refuse("required checks %v are not exactly the bundle's %v", m.RequiredChecks, bundleChecks)
	}
	// ids are the jobs' ids so far: every one distinct.
	ids := map[string]string{}
	// workspace checks one workspace's jobs (prefix names a control's)
	// against the daemon's answer for it: sealed, of the pinned bundle,
	// the candidate job on the workspace and the grader template leaving
	// the export's place free or, without a candidate command, the
	// complete grader job on the workspace at the export's place.
	workspace := func(prefix, ws string, cand, grader sandbox.Job, wantCand *sandbox.Job, wantGrader sandbox.Job) error {
		jobs := []struct {
			role string
			job  sandbox.Job
		}{{prefix + "grader", grader}}
		if wantCand != nil {
			jobs = append(jobs, struct {
				role string
				job  sandbox.Job
			}{prefix + "candidate", cand})
		}
		for _, j := range jobs {
			if err := j.job.VerifyDigest(); err != nil {
				return refuse("%s job: %v", j.role, err)
			}
			if j.job.Bundle != m.TestBundle.Digest {
				return refuse("%s job runs bundle %s, the manifest pins %s", j.role, j.job.Bundle, m.TestBundle.Digest)
			}
			if other, dup := ids[j.job.ID]; dup {
				return refuse("the %s and %s jobs share id %s", other, j.role, j.job.ID)
			}
			ids[j.job.ID] = j.role
		}
		if (wantCand == nil) != (cand.Digest == "") || (wantCand != nil && cand.Digest != wantCand.Digest) || grader.Digest != wantGrader.Digest {
			return refuse("the plan's %sjobs are not the ones the bundle prescribes", prefix)
		}
		if wantCand == nil {
			if !slices.ContainsFunc(grader.Inputs, func(in sandbox.Input) bool {
				return in.Digest == ws && in.Name == sandbox.CandidateExportInput && in.Path == sandbox.CandidateExportPath && !in.Writable
			}) {
				return refuse("without a candidate command the %sgrader job must take the workspace %s, read-only, at %s", prefix, ws, sandbox.CandidateExportPath)
			}
			return nil
		}
		if !slices.ContainsFunc(cand.Inputs, func(in sandbox.Input) bool { return in.Digest == ws && in.Writable }) {
			return refuse("the %scandidate job does not take the workspace %s", prefix, ws)
		}
		for _, in := range grader.Inputs {
			if in.Name == sandbox.CandidateExportInput || strings.HasPrefix(in.Path+"/", sandbox.CandidateExportPath+"/") || in.Writable {
				return refuse("%sgrader template input %q at %s: only protected, read-only inputs; the export's place stays free", prefix, in.Name, in.Path)
			}
		}
		return nil
	}
	if err := workspace("", r.Workspace, p.Candidate, p.Grader, b.Candidate, b.Grader); err != nil {
		return err
	}
	// Each control the bundle declares, exactly as the daemon answered.
	if len(p.Controls) != len(b.Controls) {
		return refuse("the plan has %d controls, the bundle declares %d", len(p.Controls), len(b.Controls))
	}
	for _, c := range p.Controls {
		want, ok := b.Controls[c.Kind]
		if !ok {
			return refuse("the plan's %s control is not one the bundle declares", c.Kind)
		}
		if err := workspace(c.Kind+" ", want.WorkspaceDigest, c.Candidate, c.Grader, want.Candidate, want.Grader); err != nil {
			return err
		}
	}
	inside, err := within(r.OutputDir, r.CandidateRoot)
	if err != nil {
		return refuse("%v", err)
	}
	if inside {
		return refuse("output directory %s lies inside the candidate's root %s", r.OutputDir, r.CandidateRoot)
	}
	return nil
}

// within reports whether dir is root or below it, symlinks resolved (dir
// may not exist yet: its nearest existing parent is resolved).
func within(dir, root string) (bool, error) {
	if !filepath.IsAbs(dir) || !filepath.IsAbs(root) {
		return false, fmt.Errorf("output directory %q and candidate root %q must be absolute", dir, root)
	}
	r, err := filepath.EvalSymlinks(root)
	if err != nil {
		return false, fmt.Errorf("candidate root: %w", err)
	}
	d, rest := filepath.Clean(dir), ""
	for {
		resolved, err := filepath.EvalSymlinks(d)
		if err == nil {
			d = filepath.Join(resolved, rest)
			break
		}
		if !errors.Is(err, os.ErrNotExist) || filepath.Dir(d) == d {
			return false, fmt.Errorf("output directory: %w", err)
		}
		rest = filepath.Join(filepath.Base(d), rest)
		d = filepath.Dir(d)
	}
	rel, err := filepath.Rel(r, d)
	if err != nil {
		return false, err
	}
	return rel == "." || (rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))), nil
}

// SandboxTestConfig is the seed's, reduced: the registrations, and the
// ports.
type SandboxTestConfig struct {
	Registrations []Registration
	Runner        Runner
	Blobs         Blobs
	Authenticity  SandboxAuthenticity
	Supervisor    SandboxSupervisor
}

// SandboxTestVerifier runs registered candidate/grader jobs and asks an
// external supervisor for their outcome.
type SandboxTestVerifier struct {
	cfg   SandboxTestConfig
	plans map[string]Registration
}

// NewSandboxTestVerifier validates and freezes the registrations; one that
// fails ValidateSandboxTestPlan refuses the whole configuration, before
// anything runs.
func NewSandboxTestVerifier(cfg SandboxTestConfig) (*SandboxTestVerifier, error) {
	if cfg.Runner == nil || cfg.Blobs == nil || cfg.Authenticity == nil || cfg.Supervisor == nil {
		return nil, fmt.Errorf("%w: a runner, blobs, authenticity and a supervisor are required", ErrPlanRefused)
	}
	v := &SandboxTestVerifier{cfg: cfg, plans: map[string]Registration{}}
	for i, r := range cfg.Registrations {
		if err := ValidateSandboxTestPlan(r); err != nil {
			return nil, fmt.Errorf("registration %d: %w", i, err)
		}
		if _, dup := v.plans[r.Manifest.Digest]; dup {
			return nil, fmt.Errorf("registration %d: %w: manifest %s registered twice", i, ErrPlanRefused, r.Manifest.Digest)
		}
		v.plans[r.Manifest.Digest] = r
	}
	return v, nil
}

// EvaluateTests dispatches only the reserved jobs: each declared
// control's, then the candidate job and the grader job built from the
// template and the candidate's verified export (without a candidate
// command, the grader job alone), each receipt and result authenticated
// against the pinned key, then asks the supervisor, which judges the
// candidate with the controls' outcomes. An ambiguous dispatch or wait returns
// ErrCallUncertain and allocates nothing: call again with the same request
// to reconcile (submission is idempotent by id and digest, so nothing runs
// twice, and the supervisor returns its retained assessment).
func (v *SandboxTestVerifier) EvaluateTests(ctx context.Context, req TestRequest) (CheckResult, error) {
	r, ok := v.plans[req.ManifestDigest]
	if !ok {
		return CheckResult{}, fmt.Errorf("manifest %s: %w: not registered", req.ManifestDigest, sandbox.ErrNotFound)
	}
	planDigest, err := r.PlanDigest()
	if err != nil {
		return CheckResult{}, err
	}
	// The controls' jobs first, as `sandboxd run` runs them: a control
	// that cannot be run leaves no verdict to give.
	var controls []ControlJobs
	var controlEvidence []string
	files := map[string][]byte{}
	for _, c := range r.Plan.Controls {
		ran, err := v.runWorkspace(ctx, c.Kind+" ", c.Candidate, c.Grader)
		if err != nil {
			return CheckResult{}, err
		}
		if ran.refused != "" {
			return CheckResult{Status: StatusInconclusive, Reason: c.Kind + " control: candidate export refused: " + ran.refused, PlanDigest: planDigest,
				EvidenceIDs: []string{c.Candidate.Digest, ran.cres.Result.JobDigest}}, nil
		}
		controls = append(controls, ControlJobs{Kind: c.Kind, Candidate: c.Candidate, Grader: ran.grader})
		if c.Candidate.Digest != "" {
			controlEvidence = append(controlEvidence, c.Candidate.Digest)
			files[c.Kind+".candidate.receipt.json"], files[c.Kind+".candidate.result.json"] = ran.cres.Receipt.Envelope, ran.cres.Envelope
		}
		controlEvidence = append(controlEvidence, ran.grader.Digest)
		files[c.Kind+".grader.receipt.json"], files[c.Kind+".grader.result.json"] = ran.gres.Receipt.Envelope, ran.gres.Envelope
	}
	cand := r.Plan.Candidate
	ran, err := v.runWorkspace(ctx, "", cand, r.Plan.Grader)
	if err != nil {
		return CheckResult{}, err
	}
	if ran.refused != "" {
		// The candidate's outputs cannot form an export (a name the
		// canonical form refuses): its doing, so a definitive outcome,
		// and never a pass.
		return CheckResult{Status: StatusInconclusive, Reason: "candidate export refused: " + ran.refused, PlanDigest: planDigest,
			EvidenceIDs: []string{cand.Digest, ran.cres.Result.JobDigest}}, nil
	}
	cres, grader, gres, exportDigest := ran.cres, ran.grader, ran.gres, ran.export
	genv, _ := sandbox.EnvelopeDigest(gres.Envelope)
	obs := SandboxObservation{
		Manifest: r.Manifest, Candidate: cand, Grader: grader, Controls: controls,
		CandidateArtifacts: []Ref{{Name: "workspace", Digest: r.Workspace}},
		GraderArtifacts:    []Ref{{Name: "grader/result", Digest: genv, MediaType: sandbox.MediaTypeEnvelope}},
	}
	evidence := []string{cand.Digest, grader.Digest}
	files["grader.receipt.json"], files["grader.result.json"] = gres.Receipt.Envelope, gres.Envelope
	if cand.Digest == "" {
		// No candidate command: the grader job is the candidate's own.
		obs.Candidate, evidence = grader, []string{grader.Digest}
	} else {
		cenv, _ := sandbox.EnvelopeDigest(cres.Envelope)
		obs.CandidateArtifacts = append(obs.CandidateArtifacts, Ref{Name: "candidate/result", Digest: cenv, MediaType: sandbox.MediaTypeEnvelope}, Ref{Name: "candidate/export", Digest: exportDigest})
		evidence = append(evidence, cenv)
		files["candidate.receipt.json"], files["candidate.result.json"] = cres.Receipt.Envelope, cres.Envelope
	}
	evidence = append(evidence, genv)
	for _, a := range gres.Result.Artifacts {
		obs.GraderArtifacts = append(obs.GraderArtifacts, Ref{Name: a.Path, Digest: a.Digest, MediaType: a.MediaType})
	}
	a, err := v.cfg.Supervisor.Assess(ctx, obs)
	if err != nil {
		return CheckResult{}, v.callErr(ctx, "assess", err)
	}
	if a.ManifestDigest != r.Manifest.Digest || a.SupervisorRevision != r.Manifest.SupervisorRevision || a.CandidateDigest != obs.Candidate.Digest || a.GraderDigest != grader.Digest {
		return CheckResult{}, fmt.Errorf("assess: %w: the assessment is about manifest %s (%s), jobs %s and %s, not the plan's", sandbox.ErrInvalid, a.ManifestDigest, a.SupervisorRevision, a.CandidateDigest, a.GraderDigest)
	}
	if a.Instance != r.Bundle.Instance {
		return CheckResult{}, fmt.Errorf("assess: %w: the assessment is about instance %q, the plan's bundle names %q", sandbox.ErrInvalid, a.Instance, r.Bundle.Instance)
	}
	status, reason := verdict(a.Checks, r.Manifest.RequiredChecks)
	res := CheckResult{
		Status: status, Reason: reason, PlanDigest: planDigest, ObservationRefs: a.ObservationRefs,
		EvidenceIDs: append(append(evidence, sandbox.DigestBytes(a.Envelope)), controlEvidence...),
	}
	files["assessment.json"] = a.Envelope
	if err := writeEvidence(r.OutputDir, planDigest, files); err != nil {
		return CheckResult{}, err
	}
	return res, nil
}

// ranWorkspace is one workspace's jobs as they ran: the candidate job's
// signed result and its export (none without a candidate command), and
// the grader job built on it with its signed result; or, when the canonical form refuses the export (the
// candidate's doing), why, and no grader job.
type ranWorkspace struct {
	cres, gres sandbox.SignedResult
	export     string
	grader     sandbox.Job
	refused    string
}

// runWorkspace runs one workspace's jobs (the candidate's own, or a
// control's: prefix names it): the candidate job, then the grader job
// built from the template and the candidate's verified export. An export
// the canonical form refuses is an outcome (ranWorkspace.refused), not an
// error.
func (v *SandboxTestVerifier) runWorkspace(ctx context.Context, prefix string, cand, template sandbox.Job) (ranWorkspace, error) {
	if cand.Digest == "" {
		// No candidate command: the template is the complete grader job
		// on the workspace.
		gres, err := v.run(ctx, prefix+"grader", template)
		if err != nil {
			return ranWorkspace{}, err
		}
		return ranWorkspace{gres: gres, grader: template}, nil
	}
	cres, err := v.run(ctx, prefix+"candidate", cand)
	if err != nil {
		return ranWorkspace{}, err
	}
	var export bytes.Buffer
	var fetchErr error
	exportDigest, err := sandbox.WriteCandidateExport(&export, cres.Result, func(a sandbox.Artifact) (io.ReadCloser, error) {
		b, err := v.cfg.Blobs.Blob(ctx, a.Digest, a.Size)
		if err != nil {
			fetchErr = err
		}
		return io.NopCloser(bytes.NewReader(b)), err
	})
	switch {
	case fetchErr != nil:
		return ranWorkspace{}, v.callErr(ctx, "fetch the "+prefix+"candidate's artifacts", fetchErr)
	case err != nil:
		return ranWorkspace{cres: cres, refused: err.Error()}, nil
	}
	if err := v.cfg.Blobs.PutBlob(ctx, exportDigest, export.Bytes()); err != nil {
		return ranWorkspace{}, v.callErr(ctx, "upload "+prefix+"candidate export", err)
	}
	grader, err := sandbox.GraderJob(template, cand, cres.Result, exportDigest)
	if err != nil {
		return ranWorkspace{}, err
	}
	gres, err := v.run(ctx, prefix+"grader", grader)
	if err != nil {
		return ranWorkspace{}, err
	}
	return ranWorkspace{cres: cres, gres: gres, export: exportDigest, grader: grader}, nil
}

// run dispatches one reserved job and waits for it, authenticating both
// envelopes. A result the broker signed as uncertain is an outcome (the
// supervisor finds it inconclusive), not an uncertain call.
func (v *SandboxTestVerifier) run(ctx context.Context, role string, job sandbox.Job) (sandbox.SignedResult, error) {
	rc, err := v.cfg.Runner.Submit(ctx, job)
	if err != nil {
		return sandbox.SignedResult{}, v.callErr(ctx, role+" dispatch", err)
	}
	if err := v.cfg.Authenticity.VerifyReceipt(ctx, rc, job); err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("%s job %s: receipt refused: %w", role, job.ID, err)
	}
	res, err := v.cfg.Runner.Wait(ctx, job)
	endedUncertain := err != nil && res.Envelope != nil && res.Result.Status == sandbox.StatusUncertain
	if err != nil && !endedUncertain {
		return sandbox.SignedResult{}, v.callErr(ctx, role+" wait", err)
	}
	if err := v.cfg.Authenticity.VerifyResult(ctx, res, job); err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("%s job %s: result refused: %w", role, job.ID, err)
	}
	return res, nil
}

// callErr is ErrCallUncertain for an outcome that is unknown, the error
// itself for a definitive refusal.
func (v *SandboxTestVerifier) callErr(ctx context.Context, step string, err error) error {
	if isUncertain(ctx, err) {
		return fmt.Errorf("%s: %w: reconcile with the same request: %w", step, ErrCallUncertain, err)
	}
	return fmt.Errorf("%s: %w", step, err)
}

// verdict reduces the supervised checks to one status over exactly the
// required checks: passed only if every required check passed and nothing
// else was judged; any inconclusive or missing check is inconclusive.
func verdict(checks []SupervisedCheck, required []string) (Status, string) {
	by := map[string]Status{}
	for _, c := range checks {
		by[c.Name] = c.Status
	}
	if len(by) != len(required) || len(checks) != len(required) {
		return StatusInconclusive, fmt.Sprintf("the supervisor judged %d checks, %d are required", len(checks), len(required))
	}
	status, reason := StatusPassed, "every required check passed"
	for _, n := range required {
		switch st, ok := by[n]; {
		case !ok:
			return StatusInconclusive, fmt.Sprintf("required check %q was not judged", n)
		case st == StatusInconclusive:
			return StatusInconclusive, fmt.Sprintf("check %q is inconclusive", n)
		case st == StatusFailed:
			status, reason = StatusFailed, fmt.Sprintf("check %q failed", n)
		case st != StatusPassed:
			return StatusInconclusive, fmt.Sprintf("check %q has unknown status %q", n, st)
		}
	}
	return status, reason
}

// writeEvidence keeps the envelopes under OutputDir/<plan digest>/, each
// written once: a reconciled evaluation finds the same bytes, and
// different bytes are an error, never an overwrite.
func writeEvidence(dir, planDigest string, files map[string][]byte) error {
	sub := filepath.Join(dir, strings.TrimPrefix(planDigest, "sha256:")[:32])
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return fmt.Errorf("evidence: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		p := filepath.Join(sub, name)
		if old, err := os.ReadFile(p); err == nil {
			if !bytes.Equal(old, files[name]) {
				return fmt.Errorf("evidence %s: %w: %s, not the %s kept", p, sandbox.ErrConflict, sandbox.DigestBytes(files[name]), sandbox.DigestBytes(old))
			}
			continue
		}
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, files[name], 0o600); err != nil {
			return fmt.Errorf("evidence: %w", err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return fmt.Errorf("evidence: %w", err)
		}
	}
	return nil
}
