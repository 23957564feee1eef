package verifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// Bundle is a packed evaluator bundle read from its OCI layout: the bytes
// the daemon checks by digest (manifest, bundle.json) and its layer.
type Bundle struct {
	Digest   string // of Manifest: the bundle digest every job names
	Manifest []byte
	Config   []byte // bundle.json
	Layer    []byte
}

// ReadBundle reads the bundle an OCI layout (`sandboxd bundle pack DIR -o
// LAYOUT`) holds: index.json's one manifest, its config and its one layer,
// every blob checked against its digest.
func ReadBundle(layout string) (Bundle, error) {
	blob := func(d string) ([]byte, error) {
		if !sandbox.ValidDigest(d) {
			return nil, fmt.Errorf("bundle %s: %w: malformed digest %q", layout, sandbox.ErrInvalid, d)
		}
		b, err := os.ReadFile(filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
		if err != nil {
			return nil, fmt.Errorf("bundle %s: %w", layout, err)
		}
		if got := sandbox.DigestBytes(b); got != d {
			return nil, fmt.Errorf("bundle %s: %w: blob %s hashes to %s", layout, sandbox.ErrInvalid, d, got)
		}
		return b, nil
	}
	idx, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return Bundle{}, fmt.Errorf("bundle: %w", err)
	}
	type desc struct {
		Digest string `json:"digest"`
	}
	var index struct{ Manifests []desc }
	if err := json.Unmarshal(idx, &index); err != nil || len(index.Manifests) != 1 {
		return Bundle{}, fmt.Errorf("bundle %s: %w: index.json must name exactly one manifest", layout, sandbox.ErrInvalid)
	}
	b := Bundle{Digest: index.Manifests[0].Digest}
	if b.Manifest, err = blob(b.Digest); err != nil {
		return Bundle{}, err
	}
	var m struct {
		Config desc
		Layers []desc
	}
	if err := json.Unmarshal(b.Manifest, &m); err != nil || len(m.Layers) != 1 {
		return Bundle{}, fmt.Errorf("bundle %s: %w: the manifest must name a config and one layer", layout, sandbox.ErrInvalid)
	}
	if b.Config, err = blob(m.Config.Digest); err != nil {
		return Bundle{}, err
	}
	if b.Layer, err = blob(m.Layers[0].Digest); err != nil {
		return Bundle{}, err
	}
	return b, nil
}

// PackWorkspace returns the canonical tar of a workspace directory and its
// digest: directories and regular files only (a symlink, device or other
// entry is refused, not followed), executable files as such. It is the
// digest `sandboxd workspace ingest DIR` prints for the same tree.
func PackWorkspace(dir string) ([]byte, string, error) {
	// sandbox.WriteDirTree reads as sandboxd's workspace reader does: no
	// link followed, no FIFO waited on, each file checked to be the one
	// listed (a walk with os.DirFS then an open by name followed a link
	// or blocked on a FIFO swapped in between).
	var buf bytes.Buffer
	d, err := sandbox.WriteDirTree(&buf, dir)
	if err != nil {
		return nil, "", err
	}
	return buf.Bytes(), d, nil
}

// Reserved are the job ids the host reserved, durably, for one evaluation.
type Reserved struct {
	Candidate, Grader string
	// Controls are the ids of each declared control's jobs, by kind
	// (sandbox.ControlKnownGood, …); nil derives them from Candidate and
	// Grader (ControlIDs), so that reserving those reserves them too.
	Controls map[string]sandbox.ControlIDs
}

// ControlIDs are the ids of the jobs of the controls a bundle declares,
// derived from an evaluation's own: <candidate>-<kind> and
// <grader>-<kind>. None for a bundle without controls.
func ControlIDs(b Bundle, candidate, grader string) (map[string]sandbox.ControlIDs, error) {
	var config struct {
		Controls *struct {
			KnownGood string `json:"known_good"`
			KnownBad  string `json:"known_bad"`
		} `json:"controls"`
	}
	if err := json.Unmarshal(b.Config, &config); err != nil {
		return nil, fmt.Errorf("bundle %s: bundle.json: %w: %w", b.Digest, sandbox.ErrInvalid, err)
	}
	if config.Controls == nil {
		return nil, nil
	}
	ids := map[string]sandbox.ControlIDs{}
	for kind, dir := range map[string]string{sandbox.ControlKnownGood: config.Controls.KnownGood, sandbox.ControlKnownBad: config.Controls.KnownBad} {
		if dir != "" {
			ids[kind] = sandbox.ControlIDs{CandidateJobID: candidate + "-" + kind, GraderJobID: grader + "-" + kind}
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	return ids, nil
}

// Register builds a registration from a bundle and a workspace directory:
// it uploads the workspace and the bundle's layer, asks the daemon for the
// jobs the bundle prescribes under the reserved ids (sandbox.Plan, checked
// against the request), its controls' jobs too (on the workspaces the
// daemon rebuilds from the uploaded layer), and seals the host's manifest with the required
// checks the host selected (never copied from the daemon's answer: the
// registration is refused when they differ from the bundle's). Nothing
// runs. The host records the registration before it calls EvaluateTests.
func Register(ctx context.Context, c *client.Client, b Bundle, workspaceDir string, ids Reserved, required []string, revision, outputDir string) (Registration, error) {
	tarBytes, ws, err := PackWorkspace(workspaceDir)
	if err != nil {
		return Registration{}, err
	}
	for _, up := range []struct {
		what, digest string
		content      []byte
	}{{"workspace", ws, tarBytes}, {"bundle layer", sandbox.DigestBytes(b.Layer), b.Layer}} {
		if err := c.PutBlob(ctx, up.digest, up.content); err != nil {
			return Registration{}, fmt.Errorf("upload %s: %w", up.what, err)
		}
	}
	if ids.Controls == nil {
		if ids.Controls, err = ControlIDs(b, ids.Candidate, ids.Grader); err != nil {
			return Registration{}, err
		}
	}
	p, err := c.Plan(ctx, sandbox.PlanRequest{BundleManifest: b.Manifest, BundleConfig: b.Config, WorkspaceDigest: ws, CandidateJobID: ids.Candidate, GraderJobID: ids.Grader, Controls: ids.Controls})
	if err != nil {
		return Registration{}, err
	}
	// Without a candidate command (a repository instance whose grader
	// applies the candidate's patch itself) the plan's candidate stays
	// the zero job and its grader is the complete job on the workspace.
	plan := SandboxTestPlan{Grader: p.Grader}
	if p.Candidate != nil {
		plan.Candidate = *p.Candidate
	}
	for _, kind := range slices.Sorted(maps.Keys(p.Controls)) {
		c := p.Controls[kind]
		cj := ControlJobs{Kind: kind, Grader: c.Grader}
		if c.Candidate != nil {
			cj.Candidate = *c.Candidate
		}
		plan.Controls = append(plan.Controls, cj)
	}
	m, err := SealEvaluationManifest(EvaluationManifest{
		SchemaVersion: 1, Revision: revision, TestBundle: Ref{Name: "bundle", Digest: b.Digest, MediaType: "application/vnd.oci.image.manifest.v1+json"},
		SupervisorRevision: p.SupervisorRevision, RequiredChecks: required,
	})
	if err != nil {
		return Registration{}, err
	}
	plan.ManifestDigest = m.Digest
	root, err := filepath.Abs(workspaceDir)
	if err != nil {
		return Registration{}, err
	}
	return Registration{
		Manifest: m, Plan: plan,
		Bundle: p, Workspace: ws, CandidateRoot: root, OutputDir: outputDir,
	}, nil
}

// DaemonSupervisor is the SandboxSupervisor of a sandboxd daemon: it asks
// the daemon's supervisor (POST /v1/assess) and accepts only a signed
// assessment that verifies against the pinned keys and binds the observed
// jobs and the manifest's bundle.
type DaemonSupervisor struct {
	client  *client.Client
	bundles map[string]Bundle
}

// NewDaemonSupervisor returns the supervisor for the daemon c talks to;
// bundles are the registered bundles (their bytes go with every request).
func NewDaemonSupervisor(c *client.Client, bundles ...Bundle) *DaemonSupervisor {
	s := &DaemonSupervisor{client: c, bundles: map[string]Bundle{}}
	for _, b := range bundles {
		s.bundles[b.Digest] = b
	}
	return s
}

// Assess implements SandboxSupervisor. The seed's ManifestDigest is the
// evaluation manifest's digest; the daemon's is the bundle's, which must be
// the one the manifest pins.
func (s *DaemonSupervisor) Assess(ctx context.Context, obs SandboxObservation) (SandboxAssessment, error) {
	b, ok := s.bundles[obs.Manifest.TestBundle.Digest]
	if !ok {
		return SandboxAssessment{}, fmt.Errorf("assess: %w: bundle %s is not registered", sandbox.ErrNotFound, obs.Manifest.TestBundle.Digest)
	}
	var ws string
	for _, r := range obs.CandidateArtifacts {
		if r.Name == "workspace" {
			ws = r.Digest
		}
	}
	req := sandbox.AssessRequest{BundleManifest: b.Manifest, BundleConfig: b.Config, GraderJobID: obs.Grader.ID, CandidateJobID: obs.Candidate.ID, WorkspaceDigest: ws}
	for _, c := range obs.Controls {
		if req.Controls == nil {
			req.Controls = map[string]sandbox.ControlIDs{}
		}
		req.Controls[c.Kind] = sandbox.ControlIDs{CandidateJobID: c.Candidate.ID, GraderJobID: c.Grader.ID}
	}
	sa, err := s.client.Assess(ctx, req, obs.Candidate, obs.Grader)
	if err != nil {
		var ae *client.APIError
		var ve *sandbox.VerifyError
		if !errors.As(err, &ae) && !errors.As(err, &ve) && !errors.Is(err, sandbox.ErrInvalid) {
			// The request may not have reached the daemon.
			return SandboxAssessment{}, fmt.Errorf("%w: %w", sandbox.ErrUncertain, err)
		}
		return SandboxAssessment{}, err
	}
	a := sa.Assessment
	if a.ManifestDigest != obs.Manifest.TestBundle.Digest {
		return SandboxAssessment{}, fmt.Errorf("assess: %w: assessed bundle %s, the manifest pins %s", sandbox.ErrInvalid, a.ManifestDigest, obs.Manifest.TestBundle.Digest)
	}
	out := SandboxAssessment{
		ManifestDigest: obs.Manifest.Digest, Instance: a.Instance, SupervisorRevision: a.SupervisorRevision,
		CandidateDigest: a.CandidateDigest, GraderDigest: a.GraderDigest, Envelope: sa.Envelope,
	}
	for _, c := range a.Checks {
		out.Checks = append(out.Checks, SupervisedCheck{Name: c.Name, Status: Status(c.Status)})
	}
	for _, r := range a.ObservationRefs {
		out.ObservationRefs = append(out.ObservationRefs, Ref{Name: r.Name, Digest: r.Digest, MediaType: r.MediaType})
	}
	return out, nil
}
