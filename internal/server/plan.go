package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
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
	writeJSON(w, http.StatusOK, p)
}
