package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Runner is a sandbox.Runner over a fleet: a job is submitted to the
// fleet's queue, and its receipt comes from the host that claims it,
// verified, like its result, against the pinned keys (every host's).
type Runner struct {
	co   Coordinator
	keys sandbox.KeySet
	// RideOut is how long a submit, an upload or a blob read is tried
	// again while the fleet does not answer (a stream leader's election
	// takes seconds); beyond it the call fails (a submit as uncertain).
	// Default 20s.
	RideOut time.Duration
}

var _ sandbox.Runner = (*Runner)(nil)

// NewRunner returns a runner over co whose envelopes must verify with keys.
func NewRunner(co Coordinator, keys sandbox.KeySet) *Runner {
	return &Runner{co: co, keys: keys, RideOut: 20 * time.Second}
}

// Submit queues job under its reserved id and returns its verified receipt
// once a host has accepted it (it waits for one under ctx). Submitting the
// same job again returns the same receipt; another job under the id is an
// error wrapping sandbox.ErrConflict. A fleet that does not answer (no
// quorum) gives an error wrapping sandbox.ErrUncertain: the job may have
// been queued; reconcile with the same job.
func (r *Runner) Submit(ctx context.Context, job sandbox.Job) (sandbox.SignedReceipt, error) {
	var rec Record
	err := r.rideOut(ctx, func() (err error) {
		rec, err = r.co.Submit(ctx, job)
		return err
	})
	switch {
	case errors.Is(err, sandbox.ErrConflict), errors.Is(err, sandbox.ErrInvalid), errors.Is(err, sandbox.ErrTooLarge):
		return sandbox.SignedReceipt{}, fmt.Errorf("submit job %s: %w", job.ID, err)
	case err != nil:
		return sandbox.SignedReceipt{}, fmt.Errorf("submit job %s: %w: the fleet may have queued it; reconcile with the same job: %w", job.ID, sandbox.ErrUncertain, err)
	}
	if !rec.HasReceipt() {
		rec, err = r.co.Watch(ctx, job.ID, func(rec Record) bool { return rec.HasReceipt() || rec.Digest != job.Digest })
		if err != nil {
			return sandbox.SignedReceipt{}, fmt.Errorf("submit job %s: %w: queued in the fleet, no host has accepted it yet: %w", job.ID, sandbox.ErrUncertain, err)
		}
	}
	return r.verifyReceipt(ctx, job, rec)
}

// rideOut calls f, and again every 250ms while it fails with
// ErrUnavailable, for up to r.RideOut or until ctx ends; it returns f's
// last error. f must be safe to repeat: a submit (the queue drops a
// duplicate), an upload by digest, a read.
func (r *Runner) rideOut(ctx context.Context, f func() error) error {
	err := f()
	for began := time.Now(); errors.Is(err, ErrUnavailable) && time.Since(began) < r.RideOut; {
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		err = f()
	}
	return err
}

func (r *Runner) verifyReceipt(ctx context.Context, job sandbox.Job, rec Record) (sandbox.SignedReceipt, error) {
	if rec.Digest != job.Digest {
		return sandbox.SignedReceipt{}, fmt.Errorf("job %s: the fleet holds digest %s, not %s: %w", job.ID, rec.Digest, job.Digest, sandbox.ErrConflict)
	}
	receipt, err := envelope(ctx, r.co, rec.Receipt, rec.ReceiptBlob)
	if err != nil {
		return sandbox.SignedReceipt{}, fmt.Errorf("job %s: receipt: %w", job.ID, err)
	}
	rc, err := sandbox.VerifyReceipt(r.keys, receipt, job)
	if err != nil {
		return sandbox.SignedReceipt{}, fmt.Errorf("job %s: receipt: %w", job.ID, err)
	}
	return sandbox.SignedReceipt{Receipt: rc, Envelope: bytes.Clone(receipt)}, nil
}

// Wait blocks until the job has ended and returns its verified result.
func (r *Runner) Wait(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error) {
	rec, err := r.co.Watch(ctx, job.ID, func(rec Record) bool { return rec.State == StateEnded || rec.Digest != job.Digest })
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("wait for job %s: %w: %w", job.ID, sandbox.ErrUncertain, err)
	}
	return r.verifyResult(ctx, job, rec)
}

// Result returns the verified result of an ended job; one that has not
// ended is an error wrapping sandbox.ErrNotFound.
func (r *Runner) Result(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error) {
	rec, err := r.record(ctx, job.ID)
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("job %s: %w", job.ID, err)
	}
	if rec.State != StateEnded {
		return sandbox.SignedResult{}, fmt.Errorf("job %s is %s in the fleet: %w", job.ID, rec.State, sandbox.ErrNotFound)
	}
	return r.verifyResult(ctx, job, rec)
}

func (r *Runner) verifyResult(ctx context.Context, job sandbox.Job, rec Record) (sandbox.SignedResult, error) {
	rc, err := r.verifyReceipt(ctx, job, rec)
	if err != nil {
		return sandbox.SignedResult{}, err
	}
	result, err := envelope(ctx, r.co, rec.Result, rec.ResultBlob)
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("job %s: result: %w", job.ID, err)
	}
	res, err := sandbox.VerifyResult(r.keys, result, job, rc.Envelope)
	if err != nil {
		return sandbox.SignedResult{}, fmt.Errorf("job %s: result: %w", job.ID, err)
	}
	sr := sandbox.SignedResult{Result: res, Envelope: result, Receipt: rc}
	if res.Status == sandbox.StatusUncertain {
		return sr, fmt.Errorf("job %s: %w: %s", job.ID, sandbox.ErrUncertain, res.Cause)
	}
	return sr, nil
}

// Status returns the fleet's (unverified) record of a job.
func (r *Runner) Status(ctx context.Context, id string) (Record, error) {
	return r.record(ctx, id)
}

// record reads a job's record, riding out a fleet that cannot answer for
// a while (a record is read from its stream's leader: an election takes
// seconds).
func (r *Runner) record(ctx context.Context, id string) (rec Record, err error) {
	err = r.rideOut(ctx, func() (err error) {
		rec, err = r.co.Record(ctx, id)
		return err
	})
	return rec, err
}

// PutBlob uploads content (a bundle, a workspace) under its digest,
// riding out a fleet that does not answer for a while.
func (r *Runner) PutBlob(ctx context.Context, digest string, content []byte) error {
	return r.rideOut(ctx, func() error {
		return r.co.PutBlob(ctx, digest, int64(len(content)), bytes.NewReader(content))
	})
}

// Blob fetches a blob (an artifact, a log) of at most max bytes, checked
// against its digest, riding out a fleet that does not answer for a
// while (a read cut by a node's loss starts again).
func (r *Runner) Blob(ctx context.Context, digest string, max int64) (b []byte, err error) {
	err = r.rideOut(ctx, func() (err error) {
		b, err = readBlob(ctx, r.co, digest, max)
		return err
	})
	return b, err
}
