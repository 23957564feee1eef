package evaluate

import (
	"fmt"
	"path"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// GraderTemplate is the grader job of a bundle without the candidate's
// export (unsealed): the bundle layer read-only at sandbox.BundlePath, the
// grader command, the report directory as its output, on runtime (runc or
// runsc; "" is runc). GraderJob, and sandbox.GraderJob for a verifier,
// append the export.
func GraderTemplate(m bundle.Manifest, bundleDigest, layerDigest, id, runtime string) sandbox.Job {
	return sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: m.Image, Bundle: bundleDigest,
		Inputs: []sandbox.Input{{Name: "bundle", Digest: layerDigest, Path: sandbox.BundlePath}},
		Argv:   m.Grader.Argv,
		Env: map[string]string{
			"SANDBOXD_REPORT":    m.Report.Path,
			"SANDBOXD_BUNDLE":    sandbox.BundlePath,
			"SANDBOXD_CANDIDATE": sandbox.CandidateExportPath,
		},
		WorkDir: sandbox.WorkPath, Outputs: []string{path.Dir(m.Report.Path)},
		Limits: m.DefaultLimits, Network: sandbox.NetworkNone, Runtime: runtimeOr(runtime),
	}
}

// Plan is what a bundle prescribes for a workspace under the reserved job
// ids: the sealed candidate job and grader template or, without a
// candidate command, the sealed grader job on the workspace itself. The
// jobs are exactly the ones the assess endpoint judges. They run on
// runtime ("" is runc), the host's choice as for an evaluation (Request),
// never the bundle's or the caller's.
func Plan(m bundle.Manifest, bundleDigest, layerDigest, workspace, candidateID, graderID, runtime string) (sandbox.Plan, error) {
	policy, err := PolicyOf(m)
	if err != nil {
		return sandbox.Plan{}, err
	}
	if !sandbox.ValidDigest(workspace) {
		return sandbox.Plan{}, &sandbox.FieldError{Field: "workspace_digest", Reason: fmt.Sprintf("malformed digest %q", workspace)}
	}
	p := sandbox.Plan{
		ManifestDigest: bundleDigest, LayerDigest: layerDigest, Image: m.Image, WorkspaceDigest: workspace,
		RequiredChecks: append([]string{}, policy.Required...), AllReported: policy.AllReported,
		ReportFormat: string(policy.Format), ReportPath: policy.ReportPath, SupervisorRevision: supervisor.Revision,
	}
	if m.Candidate == nil {
		p.Grader = GraderJob(m, bundleDigest, layerDigest, workspace, graderID, runtime)
	} else {
		if candidateID == graderID {
			return sandbox.Plan{}, &sandbox.FieldError{Field: "candidate_job_id", Reason: "the candidate and grader jobs need ids of their own"}
		}
		c := CandidateJob(m, bundleDigest, workspace, candidateID, runtime)
		if err := c.Seal(); err != nil {
			return sandbox.Plan{}, fmt.Errorf("candidate job: %w", err)
		}
		p.Candidate = &c
		p.Grader = GraderTemplate(m, bundleDigest, layerDigest, graderID, runtime)
	}
	if err := p.Grader.Seal(); err != nil {
		return sandbox.Plan{}, fmt.Errorf("grader job: %w", err)
	}
	return p, nil
}
