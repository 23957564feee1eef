package sandbox

import "context"

// Runner is what a verifier needs from a broker: dispatch a sealed job under
// the identity the verifier reserved for it, wait for it, and read its
// outcome, every envelope verified against pinned broker keys.
//
// A Runner never allocates an identity and never retries a job under
// another one. When it cannot tell whether the broker accepted a job or
// how it ended, it returns an error wrapping ErrUncertain; the caller
// reconciles by asking again with the same job (Submit is idempotent by
// id and digest), never by minting a new id.
type Runner interface {
	// Submit dispatches job (sealed, ID reserved by the caller) and returns
	// its verified receipt. Submitting the same job again returns the same
	// receipt bytes; another job under the same ID is an error wrapping
	// ErrConflict, and nothing runs.
	Submit(ctx context.Context, job Job) (SignedReceipt, error)
	// Wait blocks until job has ended, or ctx is done, and returns its
	// verified result. A result whose status is uncertain is returned
	// together with an error wrapping ErrUncertain.
	Wait(ctx context.Context, job Job) (SignedResult, error)
	// Result returns the verified result of an ended job without waiting;
	// a job that has not ended yet is an error wrapping ErrNotFound, and an
	// uncertain result comes with an error wrapping ErrUncertain.
	Result(ctx context.Context, job Job) (SignedResult, error)
}

// SignedReceipt is a receipt and the DSSE envelope it was verified from.
type SignedReceipt struct {
	Receipt  Receipt
	Envelope []byte
}

// SignedResult is a result, the DSSE envelope it was verified from, and the
// receipt it is chained to.
type SignedResult struct {
	Result   Result
	Envelope []byte
	Receipt  SignedReceipt
}
