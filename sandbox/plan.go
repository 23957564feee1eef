package sandbox

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// PlanRequest asks the daemon for the jobs a bundle prescribes (POST
// /v1/plan). The daemon answers from the bundle's own bytes, which it
// checks against each other by digest; it runs nothing and keeps nothing.
type PlanRequest struct {
	// BundleManifest is the bundle's OCI manifest, byte for byte; its
	// digest is the bundle digest every job of the plan names.
	BundleManifest []byte `json:"bundle_manifest"`
	// BundleConfig is the bundle's bundle.json, byte for byte; its digest
	// must be the manifest's config digest.
	BundleConfig []byte `json:"bundle_config"`
	// WorkspaceDigest is the candidate workspace's digest (its canonical
	// tar, WriteTree).
	WorkspaceDigest string `json:"workspace_digest"`
	// CandidateJobID and GraderJobID are the ids the verifier reserved.
	CandidateJobID string `json:"candidate_job_id"`
	GraderJobID    string `json:"grader_job_id"`
	// Controls are the ids reserved for the jobs of each control the
	// bundle declares, by kind (ControlKnownGood, ControlKnownBad): one
	// entry for each declared control and none for another. Every id of a
	// plan is distinct. Omitted for a bundle without controls.
	Controls map[string]ControlIDs `json:"controls,omitempty"`
}

// The kinds of control a bundle may declare: a workspace in the bundle
// that must pass (known-good) and one that must fail (known-bad), judged
// under the same jobs as the candidate's own.
const (
	ControlKnownGood = "known-good"
	ControlKnownBad  = "known-bad"
)

// ControlIDs are the ids reserved for one control's jobs. Without a
// candidate command the control has only its grader job; its candidate
// job id is then the grader's (or empty).
type ControlIDs struct {
	CandidateJobID string `json:"candidate_job_id"`
	GraderJobID    string `json:"grader_job_id"`
}

// ControlPlan is what a bundle prescribes for one of its controls: the
// control's workspace, which the daemon rebuilds from the bundle's layer,
// and the jobs on it, made as the candidate's own are (Plan.Candidate,
// Plan.Grader).
type ControlPlan struct {
	WorkspaceDigest string `json:"workspace_digest"`
	Candidate       *Job   `json:"candidate,omitempty"`
	Grader          Job    `json:"grader"`
}

// Plan is what a bundle prescribes for one workspace under reserved ids:
// the sealed candidate job and the sealed grader template, and the policy
// the supervisor will judge the grader's report under.
type Plan struct {
	// ManifestDigest is the bundle's digest (of its OCI manifest).
	ManifestDigest string `json:"manifest_digest"`
	// Instance is the task instance the bundle names (its bundle.json's
	// instance), "" for none; the assessment and the test-result carry it.
	Instance string `json:"instance,omitempty"`
	// LayerDigest is the bundle's file tree, the grader's BundlePath input.
	LayerDigest        string   `json:"layer_digest"`
	Image              string   `json:"image"`
	WorkspaceDigest    string   `json:"workspace_digest"`
	RequiredChecks     []string `json:"required_checks"`
	AllReported        bool     `json:"all_reported"`
	ReportFormat       string   `json:"report_format"`
	ReportPath         string   `json:"report_path"`
	SupervisorRevision string   `json:"supervisor_revision"`
	// Candidate is the sealed candidate job, nil when the bundle has no
	// candidate command.
	Candidate *Job `json:"candidate,omitempty"`
	// Grader is the sealed grader template when there is a candidate job
	// (GraderJob appends the candidate's export to it); without one it is
	// the complete grader job, with the workspace at CandidateExportPath.
	Grader Job `json:"grader"`
	// Controls are the jobs of each control the bundle declares, under
	// the ids the request reserved for it; omitted without controls.
	Controls map[string]ControlPlan `json:"controls,omitempty"`
}

// AssessRequest asks the daemon's supervisor to judge a grader job it ran
// (POST /v1/assess). The policy is never the caller's: it is read from the
// bundle the grader job ran, whose bytes the daemon checks by digest.
type AssessRequest struct {
	BundleManifest  []byte `json:"bundle_manifest"`
	BundleConfig    []byte `json:"bundle_config"`
	GraderJobID     string `json:"grader_job_id"`
	CandidateJobID  string `json:"candidate_job_id"`
	WorkspaceDigest string `json:"workspace_digest,omitempty"`
	// Controls name the jobs each control ran under (the plan's ids), by
	// kind. The daemon rebuilds each control's workspace from the bundle
	// itself, and judges the candidate with the controls' outcomes; a
	// declared control left out makes the verdict inconclusive.
	Controls map[string]ControlIDs `json:"controls,omitempty"`
}

// AssessResponse is the daemon's answer to an AssessRequest: the signed
// assessment (a DSSE envelope, PredicateAssessment) and, for a passed or
// failed verdict, the signed in-toto test-result statement. Both are
// retained: the same request always gets the same bytes.
type AssessResponse struct {
	Assessment json.RawMessage `json:"assessment"`
	TestResult json.RawMessage `json:"test_result,omitempty"`
}

// SignedAssessment is a verified assessment and the envelopes it was
// verified from.
type SignedAssessment struct {
	Assessment Assessment
	Envelope   []byte
	// TestResult is the signed test-result statement; nil when the
	// verdict is inconclusive.
	TestResult []byte
}

// Check reports whether p is a plan for req: every job sealed and hashing
// to its digest, under the reserved ids (all distinct), of the bundle
// whose manifest req carries and of p's image, the candidate job on req's
// workspace, p's instance the one req's bundle.json names, and exactly
// the controls req reserved ids for, each's candidate job on the
// control's own workspace. It does not prove that the jobs are the ones
// the bundle prescribes (the daemon that answered is the one definition
// of those, and its assess endpoint refuses any other); it proves that
// the plan is bound to what the caller asked about.
func (p *Plan) Check(req PlanRequest) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("plan: %w: "+format, append([]any{ErrInvalid}, a...)...)
	}
	if d := DigestBytes(req.BundleManifest); p.ManifestDigest != d {
		return bad("manifest digest %s, the bundle manifest asked about is %s", p.ManifestDigest, d)
	}
	if p.WorkspaceDigest != req.WorkspaceDigest {
		return bad("workspace %s, asked about %s", p.WorkspaceDigest, req.WorkspaceDigest)
	}
	// The daemon decodes bundle.json strictly (a key given twice or in
	// another case is refused), so this lenient read finds the same
	// instance in any bundle.json it accepted.
	var config struct {
		Instance string `json:"instance"`
	}
	if len(req.BundleConfig) > 0 {
		if err := json.Unmarshal(req.BundleConfig, &config); err != nil {
			return bad("bundle config: %v", err)
		}
	}
	if p.Instance != config.Instance {
		return bad("instance %q, the bundle config asked about names %q", p.Instance, config.Instance)
	}
	check := func(role, id string, j *Job) error {
		if err := j.VerifyDigest(); err != nil {
			return fmt.Errorf("plan: %s job: %w", role, err)
		}
		if j.ID != id || j.Bundle != p.ManifestDigest || j.Image != p.Image {
			return bad("%s job is %s of bundle %s on image %s, want %s of bundle %s on image %s", role, j.ID, j.Bundle, j.Image, id, p.ManifestDigest, p.Image)
		}
		return nil
	}
	// roles are the jobs checked so far by id: every id of a plan is
	// distinct.
	roles := map[string]string{}
	// workspace checks one workspace's jobs (prefix names a control's):
	// under the reserved ids, the candidate job (or, without one, the
	// grader job) on the workspace.
	workspace := func(prefix, ws string, candidate, grader *Job, candidateID, graderID string) error {
		taking, role := grader, prefix+"grader"
		if err := check(role, graderID, grader); err != nil {
			return err
		}
		if candidate != nil {
			taking, role = candidate, prefix+"candidate"
			if err := check(role, candidateID, candidate); err != nil {
				return err
			}
		}
		if !slices.ContainsFunc(taking.Inputs, func(in Input) bool { return in.Digest == ws }) {
			return bad("the %s job does not take the workspace %s", role, ws)
		}
		for _, j := range []struct {
			role string
			job  *Job
		}{{prefix + "candidate", candidate}, {prefix + "grader", grader}} {
			if j.job == nil {
				continue
			}
			if other, dup := roles[j.job.ID]; dup {
				return bad("the %s and %s jobs share id %s", other, j.role, j.job.ID)
			}
			roles[j.job.ID] = j.role
		}
		return nil
	}
	if err := workspace("", req.WorkspaceDigest, p.Candidate, &p.Grader, req.CandidateJobID, req.GraderJobID); err != nil {
		return err
	}
	for kind := range p.Controls {
		if _, ok := req.Controls[kind]; !ok {
			return bad("control %s was not asked about", kind)
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(req.Controls)) {
		c, ok := p.Controls[kind]
		if !ok {
			return bad("control %s is missing", kind)
		}
		if !ValidDigest(c.WorkspaceDigest) {
			return bad("control %s: malformed workspace digest %q", kind, c.WorkspaceDigest)
		}
		if (c.Candidate == nil) != (p.Candidate == nil) {
			return bad("control %s: a candidate job exactly when the candidate's own plan has one", kind)
		}
		ids := req.Controls[kind]
		if err := workspace(kind+" ", c.WorkspaceDigest, c.Candidate, &c.Grader, ids.CandidateJobID, ids.GraderJobID); err != nil {
			return err
		}
	}
	return nil
}
