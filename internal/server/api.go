package server

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// route is one endpoint; the OpenAPI document is checked against routes.
type route struct {
	method, path string
	handle       http.HandlerFunc
}

func (s *Server) routeTable() []route {
	return []route{
		{"PUT", "/v1/blobs/{digest}", s.putBlob},
		{"GET", "/v1/blobs/{digest}", s.getBlob},
		{"POST", "/v1/jobs", s.submit},
		{"GET", "/v1/jobs/{id}", s.getJob},
		{"GET", "/v1/jobs/{id}/wait", s.waitJob},
		{"POST", "/v1/jobs/{id}/cancel", s.cancelJob},
		{"GET", "/v1/identity", s.identity},
		{"POST", "/v1/assess", s.assess},
		{"POST", "/v1/gc", s.gcHandler},
		{"POST", "/v1/plan", s.plan},
		{"GET", "/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}).ServeHTTP},
		{"GET", "/healthz", s.healthz},
		{"GET", "/readyz", s.readyz},
	}
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range s.routeTable() {
		mux.HandleFunc(r.method+" "+r.path, r.handle)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no endpoint %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// view is the API's form of a journal record.
func view(rec journal.Record) sandbox.JobView {
	return sandbox.JobView{
		ID: rec.ID, Digest: rec.Digest, State: rec.State, Status: rec.Status, ContainerID: rec.ContainerID,
		AcceptedAt: rec.AcceptedAt, StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt,
		CancelRequested: rec.CancelRequested, Receipt: rec.Receipt, Result: rec.Result,
	}
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error string `json:"error"`
	// Code classifies the error for clients: invalid, too_large, conflict,
	// not_found, image_refused, queue_full, draining, result_not_recorded,
	// insufficient_storage, forbidden, quota_exceeded or internal.
	Code string `json:"code"`
	// Field names the offending field when validation failed.
	Field string `json:"field,omitempty"`
}

func codeOf(status int, err error) string {
	switch {
	case errors.Is(err, errTenantQuota):
		return "quota_exceeded"
	case errors.Is(err, errForbidden):
		return "forbidden"
	case status == http.StatusTooManyRequests:
		return "queue_full"
	case errors.Is(err, errNotRecorded):
		return "result_not_recorded"
	case status == http.StatusInsufficientStorage:
		return "insufficient_storage"
	case status == http.StatusServiceUnavailable:
		return "draining"
	case status == http.StatusRequestEntityTooLarge:
		return "too_large"
	case errors.Is(err, sandbox.ErrImageRefused):
		return "image_refused"
	case status == http.StatusConflict:
		return "conflict"
	case status == http.StatusNotFound, status == http.StatusUnprocessableEntity:
		return "not_found"
	case status < 500:
		return "invalid"
	}
	return "internal"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // envelopes are passed through byte for byte
	if err := enc.Encode(v); err != nil {
		http.Error(w, `{"error":"encode response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, code int, err error) {
	body := ErrorBody{Error: err.Error(), Code: codeOf(code, err)}
	var fe *sandbox.FieldError
	if errors.As(err, &fe) {
		body.Field = fe.Field
	}
	writeJSON(w, code, body)
}

// statusOf maps the error vocabulary to HTTP.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, sandbox.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, sandbox.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, sandbox.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, sandbox.ErrImageRefused):
		return http.StatusUnprocessableEntity
	case errors.Is(err, sandbox.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// readBody reads at most max bytes of the request body.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("request body is larger than %d bytes: %w", max, err)
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return b, nil
}

func (s *Server) reject(w http.ResponseWriter, reason string, code int, err error) {
	s.m.rejected.WithLabelValues(reason).Inc()
	writeError(w, code, err)
}

// submit accepts a sealed job, idempotently by id: the same job again gets
// the same receipt bytes; another job under the same id is a 409 and
// nothing runs. Nothing is journaled unless the job is accepted.
func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, s.cfg.MaxJobBytes)
	if err != nil {
		s.reject(w, "too_large", statusOf(err), err)
		return
	}
	job, err := sandbox.DecodeJob(body)
	if err != nil {
		s.reject(w, "invalid", http.StatusBadRequest, err)
		return
	}
	admit := func() (journal.Record, bool, *refusal) {
		if s.fleet != nil {
			return s.fleet.admitSubmitted(r.Context(), job)
		}
		return s.admit(r.Context(), job, nil)
	}
	rec, existing, ref := s.admitAs(r.Context(), job, admit)
	switch {
	case ref != nil:
		if ref.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(ref.retryAfter))
		}
		if ref.reason == "" {
			writeError(w, ref.code, ref.err)
			return
		}
		s.reject(w, ref.reason, ref.code, ref.err)
	case existing:
		writeJSON(w, http.StatusOK, view(rec))
	default:
		writeJSON(w, http.StatusAccepted, view(rec))
	}
}

// refusal is why admit did not accept a job: the HTTP status, the reason
// counted in the rejection metric ("" counts none), and Retry-After.
type refusal struct {
	code       int
	reason     string
	err        error
	retryAfter int
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// admit accepts a decoded job, idempotently by id, for the API and the
// fleet alike: it is journaled with its signed receipt and queued, or
// found journaled already (existing), or refused with nothing journaled.
// claim, if not nil, is called once the job has passed every check, just
// before it is journaled (a fleet host claims it fleet-wide there); its
// error refuses the job.
func (s *Server) admit(ctx context.Context, job sandbox.Job, claim func(context.Context) error) (journal.Record, bool, *refusal) {
	log := s.log.With("job_id", job.ID)
	if rec, err := s.cfg.Journal.Get(job.ID); err == nil {
		if rec.Digest != job.Digest {
			return journal.Record{}, false, &refusal{code: http.StatusConflict, reason: "conflict",
				err: fmt.Errorf("job %s is already bound to digest %s, not %s: %w", job.ID, rec.Digest, job.Digest, sandbox.ErrConflict)}
		}
		return rec, true, nil
	} else if !errors.Is(err, sandbox.ErrNotFound) {
		return journal.Record{}, false, &refusal{code: http.StatusInternalServerError, err: err}
	}
	// Pinned before the checks: its inputs, found there, stay until it
	// ends (or are released at once if it is refused).
	unpin := s.cfg.Blobs.Pin(inputDigests(job)...)
	defer func() {
		if unpin != nil {
			unpin()
		}
	}()
	if s.cfg.Preflight != nil {
		if err := s.cfg.Preflight(ctx, job); err != nil {
			code := statusOf(err)
			if code == http.StatusNotFound {
				code = http.StatusUnprocessableEntity // the job is fine; something it names is missing
			}
			return journal.Record{}, false, &refusal{code: code, reason: "refused", err: err}
		}
	}
	ok, draining := s.reserve()
	if draining {
		err := errors.New("the daemon is shutting down; submit again after it restarts")
		s.mu.Lock()
		if s.halted != nil {
			err = s.halted
		}
		s.mu.Unlock()
		return journal.Record{}, false, &refusal{code: http.StatusServiceUnavailable, reason: "draining", err: err}
	}
	if !ok {
		return journal.Record{}, false, &refusal{code: http.StatusTooManyRequests, reason: "queue_full", retryAfter: s.retryAfter(),
			err: fmt.Errorf("the queue is full (%d waiting); retry after the time in Retry-After", s.cfg.QueueSize)}
	}
	if claim != nil {
		if err := claim(ctx); err != nil {
			s.release()
			code := statusOf(err)
			if code == http.StatusInternalServerError {
				code = http.StatusServiceUnavailable // the fleet's doing
			}
			return journal.Record{}, false, &refusal{code: code, reason: "fleet_claim", err: err}
		}
	}
	rec, existing, err := s.accept(ctx, job)
	if err != nil || existing {
		s.release()
	}
	switch {
	case err != nil:
		code := statusOf(err)
		if code >= 500 {
			log.Error("accept", "error", err)
		}
		return journal.Record{}, false, &refusal{code: code, reason: "accept", err: err}
	case existing:
		return rec, true, nil
	}
	s.fault("accepted", job.ID)
	s.m.accepted.Inc()
	log.Info("job accepted", "job_digest", job.Digest)
	s.releaseLeases(job)
	s.pins.set(job.ID, unpin)
	unpin = nil
	s.enqueue(job.ID, true)
	return rec, false, nil
}

// accept signs the receipt and journals the job with it.
func (s *Server) accept(ctx context.Context, job sandbox.Job) (journal.Record, bool, error) {
	facts, err := s.cfg.Broker.Facts(ctx)
	if err != nil {
		return journal.Record{}, false, fmt.Errorf("runtime facts: %w", err)
	}
	facts.Runtime = job.Runtime
	canon, err := job.CanonicalJSON()
	if err != nil {
		return journal.Record{}, false, err
	}
	at := time.Now().UTC()
	env, err := s.cfg.Signer.SignAccepted(job, facts, at)
	if err != nil {
		return journal.Record{}, false, fmt.Errorf("sign receipt: %w", err)
	}
	rec, existing, err := s.cfg.Journal.AcceptAs(tenantName(ctx), job, canon, env, at)
	if err == nil && !existing {
		s.m.envelopesSigned.WithLabelValues("receipt").Inc()
	}
	return rec, existing, err
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	rec, err := s.ownedRecord(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, view(rec))
}

// waitJob long-polls until the job ends or the timeout (default 30s, at
// most MaxWait) passes; either way it answers 200 with the job's state.
func (s *Server) waitJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout := 30 * time.Second
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("timeout %q: %w: not a non-negative duration such as 30s", v, sandbox.ErrInvalid))
			return
		}
		timeout = min(d, s.cfg.MaxWait)
	}
	if s.cfg.Tenants != nil {
		if _, err := s.ownedRecord(r.Context(), id); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
	}
	if _, err := s.cfg.Journal.Get(id); errors.Is(err, sandbox.ErrNotFound) && s.fleet != nil {
		// Another host's job: the fleet's record says when it ends.
		rec, err := s.fleet.wait(r.Context(), id, timeout)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, view(rec))
		return
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		changed := s.changedChan()
		rec, err := s.cfg.Journal.Get(id)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		if rec.State.Terminal() {
			writeJSON(w, http.StatusOK, view(rec))
			return
		}
		if err := s.errUnrecorded(id); err != nil {
			writeError(w, http.StatusServiceUnavailable, err)
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			writeJSON(w, http.StatusOK, view(rec))
			return
		case <-s.closing:
			writeJSON(w, http.StatusOK, view(rec))
			return
		case <-r.Context().Done():
			return
		}
	}
}

// cancelJob cancels a queued job (it ends cancelled without running) or a
// running one (its container is killed). A job being recovered after a
// restart keeps its deadline; the request is recorded.
func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.ownedRecord(r.Context(), id); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	rec, err := s.cfg.Journal.RequestCancel(id)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	if !rec.State.Terminal() {
		if s.dequeue(id) {
			if job, err := rec.DecodeJob(); err == nil {
				s.finishUnrun(s.log.With("job_id", id), rec, job, sandbox.StatusCancelled, "cancelled before it was dispatched")
			}
		} else {
			s.mu.Lock()
			cancel := s.running[id]
			s.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		}
		if rec, err = s.cfg.Journal.Get(id); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
	}
	writeJSON(w, http.StatusAccepted, view(rec))
}

// putBlob stores a content-addressed upload: the body must hash to the
// digest in the path and fit MaxBlobBytes.
func (s *Server) putBlob(w http.ResponseWriter, r *http.Request) {
	want := r.PathValue("digest")
	if !sandbox.ValidDigest(want) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("digest %q: %w: want sha256:<64 lowercase hex>", want, sandbox.ErrInvalid))
		return
	}
	if r.ContentLength > s.cfg.MaxBlobBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("blob of %d bytes is larger than %d: %w", r.ContentLength, s.cfg.MaxBlobBytes, store.ErrTooLarge))
		return
	}
	// A blob stored already is leased, not uploaded again (its body, if
	// any, is not read), and counted against the quota like an upload.
	// With tenants, only for a tenant that may read it already: any other
	// proves it holds the bytes by uploading them (an empty PUT of a
	// guessed digest grants nothing).
	granted, err := s.mayReadBlob(r.Context(), want)
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("blob %s: %w", want, err))
		return
	}
	found, release, err := s.leaseStoredFor(r.Context(), granted, want)
	defer release()
	switch {
	case errors.Is(err, errQuota):
		writeError(w, quotaStatus, fmt.Errorf("blob %s: %w", want, err))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, fmt.Errorf("blob %s: %w", want, err))
		return
	case found:
		writeJSON(w, http.StatusOK, map[string]any{"digest": want})
		return
	}
	// Leased before it is stored: a sweep keeps it for the job that will
	// name it.
	if err := s.cfg.Blobs.Lease(want); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("blob %s: %w", want, err))
		return
	}
	releaseTenant, err := s.reserveTenantUpload(tenantOf(r.Context()), r.ContentLength)
	if err != nil {
		s.cfg.Blobs.Unlease(want)
		writeError(w, quotaStatus, fmt.Errorf("blob %s: %w", want, err))
		return
	}
	defer releaseTenant()
	room, release, err := s.reserveUpload(r.ContentLength)
	if err != nil {
		s.cfg.Blobs.Unlease(want)
		writeError(w, quotaStatus, fmt.Errorf("blob %s: %w", want, err))
		return
	}
	defer release()
	d, n, err := s.cfg.Blobs.Put(http.MaxBytesReader(w, r.Body, room), want, room)
	if err != nil {
		s.cfg.Blobs.Unlease(want)
		writeError(w, statusOf(err), fmt.Errorf("blob %s: %w", want, err))
		return
	}
	if err := s.cfg.Journal.GrantBlobs(tenantName(r.Context()), d); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("blob %s: %w", want, err))
		return
	}
	s.m.bytesUploaded.Add(float64(n))
	writeJSON(w, http.StatusCreated, map[string]any{"digest": d, "size": n})
}

// getBlob returns a stored blob (an uploaded input, a collected artifact
// or log) by digest.
func (s *Server) getBlob(w http.ResponseWriter, r *http.Request) {
	d := r.PathValue("digest")
	if !sandbox.ValidDigest(d) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("digest %q: %w", d, sandbox.ErrInvalid))
		return
	}
	switch ok, err := s.mayReadBlob(r.Context(), d); {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
		return
	case !ok:
		err := errBlobNotFound(d)
		writeError(w, statusOf(err), err)
		return
	}
	f, err := s.cfg.Blobs.Open(d)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Size(), 10))
	w.Header().Set("Docker-Content-Digest", d)
	io.Copy(w, f)
}

// Identity is what the identity endpoint reports.
type Identity struct {
	Name         string               `json:"name"`
	KeyID        string               `json:"key_id"`
	PublicKey    string               `json:"public_key"` // PEM
	EphemeralKey bool                 `json:"ephemeral_key"`
	Version      string               `json:"version"`
	Runtime      sandbox.RuntimeFacts `json:"runtime"`
}

func (s *Server) identity(w http.ResponseWriter, r *http.Request) {
	facts, err := s.cfg.Broker.Facts(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("runtime facts: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, Identity{
		Name: s.cfg.Name, KeyID: s.cfg.Signer.KeyID(), PublicKey: string(s.cfg.Signer.PublicKeyPEM()),
		EphemeralKey: s.cfg.Signer.Ephemeral(), Version: s.cfg.Version, Runtime: facts,
	})
}

// AssessRequest asks the supervisor to judge a grader job this daemon ran
// (sandbox.AssessRequest).
type AssessRequest = sandbox.AssessRequest

// assess judges a finished grader job from the journal's signed result
// (verified against this daemon's own key) and the report in the blob
// store, and answers the signed assessment (sandbox.AssessResponse): made
// once per assessment and retained, so it comes back byte for byte.
func (s *Server) assess(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Supervisor == nil {
		writeError(w, http.StatusNotFound, errors.New("assessments are not enabled on this daemon"))
		return
	}
	body, err := readBody(w, r, s.cfg.MaxJobBytes)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	var req AssessRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("assess request: %w: %w", sandbox.ErrInvalid, err))
		return
	}
	signed, err := s.signedAssessment(r.Context(), req)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(signed)
}

// signedAssessment judges the jobs req names: the evaluation the grader
// job's bundle prescribes takes their verified results from the journal
// (Accept refuses any job it does not prescribe, 409), and the supervisor
// judges them.
func (s *Server) signedAssessment(ctx context.Context, req AssessRequest) ([]byte, error) {
	grader, err := s.ranJob(ctx, req.GraderJobID)
	if err != nil {
		return nil, fmt.Errorf("grader job: %w", err)
	}
	if req.WorkspaceDigest != "" {
		// The workspace is read from the store: the tenant's own only.
		if ok, err := s.mayReadBlob(ctx, req.WorkspaceDigest); err != nil || !ok {
			return nil, cmp.Or(err, fmt.Errorf("workspace: %w", errBlobNotFound(req.WorkspaceDigest)))
		}
	}
	bm, layer, err := bundleOf(grader.Job, req.BundleManifest, req.BundleConfig)
	if err != nil {
		return nil, err
	}
	e, err := evaluate.New(bm, grader.Job.Bundle, layer, grader.Job.Runtime)
	if err != nil {
		return nil, err
	}
	jobs := evaluate.Judged{Grader: grader.Job, Candidate: grader.Job, GraderResult: grader.envelope}
	var candidate *evaluate.Ran
	if req.CandidateJobID != req.GraderJobID {
		// A separate candidate job must have ended and verify: its
		// failure is evidence, never silently left out.
		c, err := s.ranJob(ctx, req.CandidateJobID)
		if errors.Is(err, errNotEnded) {
			return nil, fmt.Errorf("candidate job %s has no verified result yet: %w: %w", req.CandidateJobID, sandbox.ErrConflict, err)
		}
		if err != nil {
			return nil, fmt.Errorf("candidate job: %w", err)
		}
		candidate = &c.Ran
		jobs.Candidate, jobs.CandidateResult = c.Job, c.envelope
	}
	results, err := e.Accept(ctx, s.cfg.Blobs, req.WorkspaceDigest, candidate, grader.Ran)
	if err != nil {
		return nil, fmt.Errorf("assess request: %w: %w", sandbox.ErrConflict, err)
	}
	controls, err := s.acceptControls(ctx, e, req, &jobs)
	if err != nil {
		return nil, err
	}
	judge := func(ev supervisor.Evidence) (supervisor.Assessment, []byte, error) {
		return s.cfg.Supervisor.Assess(ctx, ev)
	}
	_, a, retained, err := e.Judge(s.cfg.Blobs, controls, results, judge)
	if err != nil {
		return nil, err
	}
	return evaluate.SignAssessment(ctx, s.cfg.Supervisor, s.cfg.Signer, a, retained, jobs)
}

// acceptControls takes the verified results of the controls' jobs req
// names, as the candidate's are taken: each must be the job the bundle
// prescribes for that control, on the control's workspace rebuilt here
// from the stored layer (never a digest the caller gives; any other job
// is refused, 409). A declared control req leaves out is left to the
// judgement, which finds it missing.
func (s *Server) acceptControls(ctx context.Context, e *evaluate.Evaluation, req AssessRequest, jobs *evaluate.Judged) (map[supervisor.ControlKind]evaluate.Results, error) {
	if len(req.Controls) == 0 {
		return nil, nil
	}
	for kind := range req.Controls {
		if !slices.Contains(e.Policy.Controls, supervisor.ControlKind(kind)) {
			return nil, fmt.Errorf("assess request: %w: controls: the bundle declares no %s control", sandbox.ErrInvalid, kind)
		}
	}
	if err := s.layerStored(ctx, e.LayerDigest); err != nil {
		return nil, fmt.Errorf("assess request: %w", err)
	}
	controls := map[supervisor.ControlKind]evaluate.Results{}
	jobs.Controls = map[supervisor.ControlKind]evaluate.Judged{}
	for _, k := range slices.Sorted(maps.Keys(req.Controls)) {
		kind, ids := supervisor.ControlKind(k), req.Controls[k]
		ws, err := e.ControlWorkspace(ctx, s.cfg.Blobs, kind)
		if err != nil {
			return nil, fmt.Errorf("control %s: %w", kind, err)
		}
		g, err := s.ranJob(ctx, ids.GraderJobID)
		if errors.Is(err, errNotEnded) {
			return nil, fmt.Errorf("control %s: grader job %s has no verified result yet: %w: %w", kind, ids.GraderJobID, sandbox.ErrConflict, err)
		}
		if err != nil {
			return nil, fmt.Errorf("control %s: grader job: %w", kind, err)
		}
		judged := evaluate.Judged{Grader: g.Job, Candidate: g.Job, GraderResult: g.envelope}
		var candidate *evaluate.Ran
		if ids.CandidateJobID != "" && ids.CandidateJobID != ids.GraderJobID {
			c, err := s.ranJob(ctx, ids.CandidateJobID)
			if errors.Is(err, errNotEnded) {
				return nil, fmt.Errorf("control %s: candidate job %s has no verified result yet: %w: %w", kind, ids.CandidateJobID, sandbox.ErrConflict, err)
			}
			if err != nil {
				return nil, fmt.Errorf("control %s: candidate job: %w", kind, err)
			}
			candidate = &c.Ran
			judged.Candidate, judged.CandidateResult = c.Job, c.envelope
		}
		r, err := e.Accept(ctx, s.cfg.Blobs, ws, candidate, g.Ran)
		if err != nil {
			return nil, fmt.Errorf("assess request: control %s: %w: %w", kind, sandbox.ErrConflict, err)
		}
		controls[kind] = r
		jobs.Controls[kind] = judged
	}
	return controls, nil
}

// ranJob is a job of the journal with its verified result and the
// result's envelope.
type ranJob struct {
	evaluate.Ran
	envelope []byte
}

// errNotEnded marks a job that has no result yet.
var errNotEnded = errors.New("not ended")

// ranJob returns a job that has ended, with its result verified against
// this daemon's keys (a fleet's pinned ones too) and chained to its
// receipt.
func (s *Server) ranJob(ctx context.Context, id string) (ranJob, error) {
	rec, err := s.ownedRecord(ctx, id)
	if err != nil {
		return ranJob{}, err
	}
	if !rec.State.Terminal() {
		return ranJob{}, fmt.Errorf("job %s has not ended (%s): %w: %w", id, rec.State, errNotEnded, sandbox.ErrNotFound)
	}
	job, err := rec.DecodeJob()
	if err != nil {
		return ranJob{}, err
	}
	res, err := sandbox.VerifyResult(s.keys, rec.Result, job, rec.Receipt)
	if err != nil {
		return ranJob{}, err
	}
	return ranJob{Ran: evaluate.Ran{Job: job, Result: res}, envelope: rec.Result}, nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is ready once recovery has read the journal and until shutdown.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
		return
	}
	s.mu.Lock()
	q, run := len(s.queue), len(s.running)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "queued": q, "running": run})
}

// statusRecorder remembers the response code for the access log.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		level := slog.LevelDebug
		if rec.code >= 400 {
			level = slog.LevelInfo
		}
		attrs := []any{"method", r.Method, "path", r.URL.Path, "code", rec.code, "duration_ms", time.Since(start).Milliseconds()}
		if id := r.PathValue("id"); id != "" {
			attrs = append(attrs, "job_id", id)
		}
		s.log.Log(r.Context(), level, "request", attrs...)
	})
}

// bundleOf returns the manifest (bundle.json) and layer digest of the
// bundle the grader job ran: the OCI manifest must hash to the job's bundle
// digest and name bundle.json as its config by digest and one layer, and
// bundle.json must name the job's image.
func bundleOf(job sandbox.Job, manifest, config []byte) (bundle.Manifest, string, error) {
	bad := func(format string, a ...any) (bundle.Manifest, string, error) {
		return bundle.Manifest{}, "", fmt.Errorf("assess request: %w: "+format, append([]any{sandbox.ErrInvalid}, a...)...)
	}
	if job.Bundle == "" {
		return bad("grader job %s names no bundle", job.ID)
	}
	if d := sandbox.DigestBytes(manifest); d != job.Bundle {
		return bad("bundle_manifest hashes to %s, the grader job ran bundle %s", d, job.Bundle)
	}
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(manifest, &m); err != nil {
		return bad("bundle_manifest: %v", err)
	}
	if len(m.Layers) != 1 || !sandbox.ValidDigest(m.Layers[0].Digest) {
		return bad("bundle_manifest names %d layers, want exactly one", len(m.Layers))
	}
	if d := sandbox.DigestBytes(config); d != m.Config.Digest {
		return bad("bundle_config hashes to %s, the manifest names %s", d, m.Config.Digest)
	}
	bm, err := bundle.DecodeManifest(config)
	if err != nil {
		return bad("bundle_config: %v", err)
	}
	if bm.Image != job.Image {
		return bad("the bundle names image %s, the grader job ran %s", bm.Image, job.Image)
	}
	return bm, m.Layers[0].Digest, nil
}
