package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// ErrBusy marks a submission the daemon refused because its queue was full
// or it was shutting down, until the caller's context ended. The job was
// not accepted; submitting it again is safe.
var ErrBusy = errors.New("daemon busy")

// Client is a daemon client. Its methods are safe for concurrent use.
type Client struct {
	base string
	hc   *http.Client
	keys sandbox.KeySet
	// PollTimeout is how long one wait request may block on the daemon.
	PollTimeout time.Duration
}

var _ sandbox.Runner = (*Client)(nil)

// New returns a client for the daemon listening on the unix socket at
// socketPath; keys are the pinned broker keys.
func New(socketPath string, keys sandbox.KeySet) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConnsPerHost: 16,
	}
	return &Client{base: "http://sandboxd", hc: &http.Client{Transport: tr}, keys: keys, PollTimeout: 30 * time.Second}
}

// NewTLS returns a client for a daemon at baseURL ("https://host:port")
// with mutual TLS; cfg must carry the client certificate.
func NewTLS(baseURL string, cfg *tls.Config, keys sandbox.KeySet) *Client {
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 16}
	return &Client{base: baseURL, hc: &http.Client{Transport: tr}, keys: keys, PollTimeout: 30 * time.Second}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// APIError is an error answer of the daemon.
type APIError struct {
	StatusCode int
	Message    string `json:"error"`
	Code       string `json:"code"`
	Field      string `json:"field,omitempty"`
	RetryAfter time.Duration
}

func (e *APIError) Error() string { return fmt.Sprintf("sandboxd: %d: %s", e.StatusCode, e.Message) }

// Unwrap maps the daemon's error code to the sandbox sentinels (for
// errors.Is): too_large is both sandbox.ErrInvalid and sandbox.ErrTooLarge.
func (e *APIError) Unwrap() []error {
	switch e.Code {
	case "invalid":
		return []error{sandbox.ErrInvalid}
	case "too_large":
		return []error{sandbox.ErrInvalid, sandbox.ErrTooLarge}
	case "conflict":
		return []error{sandbox.ErrConflict}
	case "not_found":
		return []error{sandbox.ErrNotFound}
	case "image_refused":
		return []error{sandbox.ErrImageRefused}
	case "queue_full", "draining":
		return []error{ErrBusy}
	case "quota_exceeded":
		// A tenant's jobs at its max_jobs (429): busy for this tenant, and
		// submitted again after Retry-After as a full queue's are. A
		// limit over its quota (403) or its uploads' (507) is no wait.
		if e.StatusCode == http.StatusTooManyRequests {
			return []error{ErrBusy}
		}
	}
	return nil
}

// maxAnswerBytes bounds an answer the client reads into memory. The
// largest is a job's view: its signed result, at most
// sandbox.MaxResultBytes, and its receipt, which carries the job (a daemon
// takes in at most 1 MiB of a job's JSON: a receipt of a few MiB); 16 MiB
// more covers the receipt and the view's other fields with room.
const maxAnswerBytes = sandbox.MaxResultBytes + 16<<20

// maxErrorBytes bounds an error answer the client reads.
const maxErrorBytes = 1 << 20

// do sends one request and decodes a JSON answer into out. A transport
// error is returned as is; an error status as *APIError; an answer over
// maxAnswerBytes as an error wrapping sandbox.ErrTooLarge, never cut short.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	limit := int64(maxAnswerBytes)
	if resp.StatusCode >= 300 {
		limit = maxErrorBytes // a message: cut, it still says what failed
	} else if resp.ContentLength > limit {
		return tooLarge(method, path, resp.ContentLength)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return err
	}
	if resp.StatusCode < 300 && int64(len(data)) > limit {
		return tooLarge(method, path, -1)
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{StatusCode: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Message == "" {
			ae.Message = string(bytes.TrimSpace(data))
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			ae.RetryAfter = time.Duration(s) * time.Second
		}
		return ae
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("sandboxd: decode answer: %w", err)
		}
	}
	return nil
}

// tooLarge is the error for an answer over maxAnswerBytes (of n bytes, if
// the answer said).
func tooLarge(method, path string, n int64) error {
	size := fmt.Sprintf("more than %d bytes", maxAnswerBytes)
	if n >= 0 {
		size = fmt.Sprintf("%d bytes, more than %d", n, maxAnswerBytes)
	}
	return fmt.Errorf("sandboxd: %s %s: %w: the answer takes %s (a signed result is at most %d bytes, sandbox.MaxResultBytes)",
		method, path, sandbox.ErrTooLarge, size, sandbox.MaxResultBytes)
}

// Submit dispatches job under its reserved id and returns its verified
// receipt. A full queue is waited out (Retry-After) until ctx ends; a
// request whose fate is unknown is sent again with the same bytes, and if
// it stays unknown the error wraps sandbox.ErrUncertain.
func (c *Client) Submit(ctx context.Context, job sandbox.Job) (sandbox.SignedReceipt, error) {
	if err := job.VerifyDigest(); err != nil {
		return sandbox.SignedReceipt{}, err
	}
	body, err := json.Marshal(job)
	if err != nil {
		return sandbox.SignedReceipt{}, err
	}
	var lastAmbiguous error
	backoff := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		var st sandbox.JobView
		err := c.do(ctx, http.MethodPost, "/v1/jobs", body, &st)
		var ae *APIError
		switch {
		case err == nil:
			return c.verifyReceipt(job, st)
		case errors.As(err, &ae) && errors.Is(ae, ErrBusy):
			wait := max(ae.RetryAfter, 100*time.Millisecond)
			if !sleep(ctx, wait) {
				if lastAmbiguous != nil {
					return sandbox.SignedReceipt{}, uncertain(job, lastAmbiguous)
				}
				return sandbox.SignedReceipt{}, fmt.Errorf("submit job %s: %w: %w", job.ID, ErrBusy, ctx.Err())
			}
		case errors.As(err, &ae) && ae.StatusCode < 500, errors.Is(err, sandbox.ErrTooLarge):
			return sandbox.SignedReceipt{}, fmt.Errorf("submit job %s: %w", job.ID, err)
		default:
			// A transport error or a 5xx: the daemon may have accepted
			// the job. Ask again with the same bytes.
			lastAmbiguous = err
			if attempt >= 4 || !sleep(ctx, backoff) {
				return sandbox.SignedReceipt{}, uncertain(job, err)
			}
			backoff *= 2
		}
	}
}

func uncertain(job sandbox.Job, err error) error {
	return fmt.Errorf("submit job %s: %w: the daemon may have accepted it; reconcile with the same job: %w", job.ID, sandbox.ErrUncertain, err)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (c *Client) verifyReceipt(job sandbox.Job, st sandbox.JobView) (sandbox.SignedReceipt, error) {
	if st.Digest != job.Digest {
		return sandbox.SignedReceipt{}, fmt.Errorf("job %s: the daemon holds digest %s, not %s: %w", job.ID, st.Digest, job.Digest, sandbox.ErrConflict)
	}
	rc, err := sandbox.VerifyReceipt(c.keys, st.Receipt, job)
	if err != nil {
		return sandbox.SignedReceipt{}, fmt.Errorf("job %s: receipt: %w", job.ID, err)
	}
	return sandbox.SignedReceipt{Receipt: rc, Envelope: bytes.Clone(st.Receipt)}, nil
}

// Status returns the daemon's (unverified) view of a job.
func (c *Client) Status(ctx context.Context, id string) (sandbox.JobView, error) {
	var st sandbox.JobView
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &st)
	return st, err
}

// GC asks the daemon to collect its caches now (orphan blobs, then what
// is beyond the blob and volume budgets) and returns its report as JSON.
func (c *Client) GC(ctx context.Context) (json.RawMessage, error) {
	var rep json.RawMessage
	err := c.do(ctx, http.MethodPost, "/v1/gc", nil, &rep)
	return rep, err
}

// Result returns the verified result of an ended job.
func (c *Client) Result(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error) {
	st, err := c.Status(ctx, job.ID)
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("job %s: %w", job.ID, err)
	}
	if !st.Terminal() {
		return sandbox.SignedResult{}, fmt.Errorf("job %s is %s: %w", job.ID, st.State, sandbox.ErrNotFound)
	}
	return c.verifyResult(job, st)
}

// Wait blocks until the job has ended and returns its verified result.
// Transport errors are retried until ctx ends; then the error wraps
// sandbox.ErrUncertain (the job may still be running).
func (c *Client) Wait(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error) {
	path := "/v1/jobs/" + url.PathEscape(job.ID) + "/wait?timeout=" + c.PollTimeout.String()
	backoff := 100 * time.Millisecond
	for {
		var st sandbox.JobView
		asked := time.Now()
		err := c.do(ctx, http.MethodGet, path, nil, &st)
		var ae *APIError
		switch {
		case err == nil && st.Terminal():
			return c.verifyResult(job, st)
		case err == nil:
			if st.Digest != job.Digest {
				return sandbox.SignedResult{}, fmt.Errorf("job %s: the daemon holds digest %s, not %s: %w", job.ID, st.Digest, job.Digest, sandbox.ErrConflict)
			}
			backoff = 100 * time.Millisecond
			// A long poll that answered early without an end (a daemon
			// shutting down answers at once) is not asked again at once.
			if time.Since(asked) < time.Second && !sleep(ctx, time.Second) {
				return sandbox.SignedResult{}, fmt.Errorf("wait for job %s: %w: %w", job.ID, sandbox.ErrUncertain, ctx.Err())
			}
			continue
		case errors.As(err, &ae) && ae.StatusCode < 500, errors.Is(err, sandbox.ErrTooLarge):
			// An answer over the bound comes back the same if asked again.
			return sandbox.SignedResult{}, fmt.Errorf("wait for job %s: %w", job.ID, err)
		}
		if !sleep(ctx, backoff) {
			return sandbox.SignedResult{}, fmt.Errorf("wait for job %s: %w: %w (last error: %v)", job.ID, sandbox.ErrUncertain, ctx.Err(), err)
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (c *Client) verifyResult(job sandbox.Job, st sandbox.JobView) (sandbox.SignedResult, error) {
	rc, err := c.verifyReceipt(job, st)
	if err != nil {
		return sandbox.SignedResult{}, err
	}
	res, err := sandbox.VerifyResult(c.keys, st.Result, job, st.Receipt)
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("job %s: result: %w", job.ID, err)
	}
	sr := sandbox.SignedResult{Result: res, Envelope: bytes.Clone(st.Result), Receipt: rc}
	if res.Status == sandbox.StatusUncertain {
		return sr, fmt.Errorf("job %s: %w: %s", job.ID, sandbox.ErrUncertain, res.Cause)
	}
	return sr, nil
}

// Cancel asks the daemon to cancel a job.
func (c *Client) Cancel(ctx context.Context, id string) (sandbox.JobView, error) {
	var st sandbox.JobView
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &st)
	return st, err
}

// PutBlob uploads content under its digest; the daemon re-hashes it.
func (c *Client) PutBlob(ctx context.Context, digest string, content []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/v1/blobs/"+digest, bytes.NewReader(content))
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		ae := &APIError{StatusCode: resp.StatusCode}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(data, ae) != nil {
			ae.Message = string(data)
		}
		return ae
	}
	return nil
}

// Blob fetches a blob (an artifact or log) and checks its digest.
func (c *Client) Blob(ctx context.Context, digest string, max int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/blobs/"+digest, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &APIError{StatusCode: resp.StatusCode, Message: "blob " + digest, Code: map[bool]string{true: "not_found"}[resp.StatusCode == 404]}
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("blob %s: more than %d bytes", digest, max)
	}
	if got := sandbox.DigestBytes(data); got != digest {
		return nil, fmt.Errorf("blob %s: content hashes to %s", digest, got)
	}
	return data, nil
}

// Identity is the daemon's broker identity.
type Identity struct {
	Name         string               `json:"name"`
	KeyID        string               `json:"key_id"`
	PublicKey    string               `json:"public_key"`
	EphemeralKey bool                 `json:"ephemeral_key"`
	Version      string               `json:"version"`
	Runtime      sandbox.RuntimeFacts `json:"runtime"`
}

// Identity returns what the daemon says about itself. Its public key is a
// claim: pin keys obtained out of band.
func (c *Client) Identity(ctx context.Context) (Identity, error) {
	var id Identity
	err := c.do(ctx, http.MethodGet, "/v1/identity", nil, &id)
	return id, err
}

// Plan asks the daemon for the jobs a bundle prescribes for a workspace
// under the ids the caller reserved, and checks that the answer is bound
// to the request (sandbox.Plan.Check). Nothing runs.
func (c *Client) Plan(ctx context.Context, req sandbox.PlanRequest) (sandbox.Plan, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return sandbox.Plan{}, err
	}
	var p sandbox.Plan
	if err := c.do(ctx, http.MethodPost, "/v1/plan", body, &p); err != nil {
		return sandbox.Plan{}, fmt.Errorf("plan: %w", err)
	}
	if err := p.Check(req); err != nil {
		return sandbox.Plan{}, err
	}
	return p, nil
}

// Assess asks the daemon's supervisor to judge the grader job against the
// candidate job (both sealed, as the caller dispatched them) and returns
// the signed assessment, verified against the pinned keys and bound to
// both jobs; the test-result statement, when there is one, is verified
// too. The daemon retains it: asking again returns the same bytes.
func (c *Client) Assess(ctx context.Context, req sandbox.AssessRequest, candidate, grader sandbox.Job) (sandbox.SignedAssessment, error) {
	if req.CandidateJobID != candidate.ID || req.GraderJobID != grader.ID {
		return sandbox.SignedAssessment{}, fmt.Errorf("assess: %w: the request names jobs %s and %s, not %s and %s", sandbox.ErrInvalid, req.CandidateJobID, req.GraderJobID, candidate.ID, grader.ID)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return sandbox.SignedAssessment{}, err
	}
	var resp sandbox.AssessResponse
	if err := c.do(ctx, http.MethodPost, "/v1/assess", body, &resp); err != nil {
		return sandbox.SignedAssessment{}, fmt.Errorf("assess: %w", err)
	}
	a, err := sandbox.VerifyAssessment(c.keys, resp.Assessment, candidate, grader)
	if err != nil {
		return sandbox.SignedAssessment{}, fmt.Errorf("assess: %w", err)
	}
	sa := sandbox.SignedAssessment{Assessment: a, Envelope: bytes.Clone(resp.Assessment)}
	if len(resp.TestResult) > 0 {
		tr, err := sandbox.VerifyTestResult(c.keys, resp.TestResult)
		if err == nil {
			err = a.CheckTestResult(tr)
		}
		if err != nil {
			return sandbox.SignedAssessment{}, fmt.Errorf("assess: test-result statement: %w", err)
		}
		sa.TestResult = bytes.Clone(resp.TestResult)
	}
	return sa, nil
}
