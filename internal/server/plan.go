package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// plan answers the jobs a bundle prescribes for a workspace under the ids
// the caller reserved (sandbox.Plan), from the bundle's own bytes checked
// against each other by digest. It runs, journals and keeps nothing: a
// verifier registers the answer as its plan before it dispatches anything,
// and the assess endpoint later judges only these jobs.
func (s *Server) plan(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, s.cfg.MaxJobBytes)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	var req sandbox.PlanRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("plan request: %w: %w", sandbox.ErrInvalid, err))
		return
	}
	cfg, err := bundle.DecodeManifest(req.BundleConfig)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("plan request: %w: bundle_config: %w", sandbox.ErrInvalid, err))
		return
	}
	digest := sandbox.DigestBytes(req.BundleManifest)
	bm, layer, err := bundleOf(sandbox.Job{ID: req.GraderJobID, Bundle: digest, Image: cfg.Image}, req.BundleManifest, req.BundleConfig)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	e, err := evaluate.New(bm, digest, layer, s.cfg.Runtime)
	if err != nil {
		writeError(w, statusOf(err), fmt.Errorf("plan request: %w", err))
		return
	}
	p, err := e.Plan(req.WorkspaceDigest, req.CandidateJobID, req.GraderJobID)
	if err != nil {
		writeError(w, statusOf(err), fmt.Errorf("plan request: %w", err))
		return
	}
	if p.Controls, err = s.planControls(r.Context(), e, req); err != nil {
		code := statusOf(err)
		if errors.Is(err, errQuota) {
			code = quotaStatus
		}
		writeError(w, code, fmt.Errorf("plan request: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// planControls plans the jobs of each control the bundle declares under
// the ids req reserved for it, on the control's workspace rebuilt from
// the bundle's layer (which must be stored, and the caller's to read, as
// the grader's input must): exactly the jobs `sandboxd run` runs for it.
// The workspace is kept for the jobs that will name it.
func (s *Server) planControls(ctx context.Context, e *evaluate.Evaluation, req sandbox.PlanRequest) (map[string]sandbox.ControlPlan, error) {
	if err := checkControlIDs(e, req); err != nil {
		return nil, err
	}
	if len(e.Policy.Controls) == 0 {
		return nil, nil
	}
	if err := s.layerStored(ctx, e.LayerDigest); err != nil {
		return nil, err
	}
	plans := map[string]sandbox.ControlPlan{}
	for _, kind := range e.Policy.Controls {
		ws, err := e.ControlWorkspace(ctx, s.cfg.Blobs, kind)
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		// As an upload: leased until a job names it, and the tenant's
		// to read, so that it may submit the control's jobs; counted
		// against its quotas as its upload would be.
		release, err := s.reserveTenantMade(tenantOf(ctx), ws)
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		err = s.cfg.Blobs.Lease(ws)
		if err == nil {
			err = s.cfg.Journal.GrantBlobs(tenantName(ctx), ws)
		}
		release()
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		ids := req.Controls[string(kind)]
		cp, err := e.Plan(ws, ids.CandidateJobID, ids.GraderJobID)
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		plans[string(kind)] = sandbox.ControlPlan{WorkspaceDigest: ws, Candidate: cp.Candidate, Grader: cp.Grader}
	}
	return plans, nil
}

// checkControlIDs refuses ids for a control the bundle does not declare,
// a declared control without ids, and any id of the plan given twice.
func checkControlIDs(e *evaluate.Evaluation, req sandbox.PlanRequest) error {
	bad := func(format string, a ...any) error {
		return &sandbox.FieldError{Field: "controls", Reason: fmt.Sprintf(format, a...)}
	}
	for kind := range req.Controls {
		if !slices.Contains(e.Policy.Controls, supervisor.ControlKind(kind)) {
			return bad("the bundle declares no %s control", kind)
		}
	}
	used := map[string]string{req.GraderJobID: "grader"}
	if e.HasCandidate() {
		used[req.CandidateJobID] = "candidate"
	}
	for _, kind := range e.Policy.Controls {
		ids, ok := req.Controls[string(kind)]
		if !ok {
			return bad("the bundle declares a %s control: reserve ids for its jobs (controls.%s.candidate_job_id, grader_job_id)", kind, kind)
		}
		roles := []struct{ role, id string }{{"grader", ids.GraderJobID}}
		if e.HasCandidate() {
			roles = append(roles, struct{ role, id string }{"candidate", ids.CandidateJobID})
		}
		for _, r := range roles {
			role := string(kind) + " " + r.role
			if r.id == "" {
				return bad("%s job: no id reserved", role)
			}
			if other, dup := used[r.id]; dup {
				return bad("the %s and %s jobs share id %s", other, role, r.id)
			}
			used[r.id] = role
		}
	}
	return nil
}

// layerStored reports why the bundle's layer cannot be read for its
// controls' workspaces: not uploaded, or not the caller's to read.
func (s *Server) layerStored(ctx context.Context, layer string) error {
	ok, err := s.mayReadBlob(ctx, layer)
	if err != nil {
		return err
	}
	if !ok || !s.cfg.Blobs.Has(layer) {
		return fmt.Errorf("the bundle's controls are rebuilt from its layer %s: upload it first (PUT /v1/blobs/%s): %w", layer, layer, errBlobNotFound(layer))
	}
	return nil
}
