package sandbox

import (
	"bytes"
	"context"
	"fmt"
)

// Authenticity checks that a signed receipt or result was made by a pinned
// broker key and is about exactly the job the caller expected. It is the
// verifier's SandboxAuthenticity port: it trusts the envelopes' signatures,
// never what a workload printed, and never the decoded values a SignedReceipt
// or SignedResult carries beside their envelopes (those must be exactly what
// the envelopes say).
type Authenticity struct {
	keys KeySet
}

// NewAuthenticity returns an Authenticity over the pinned keys; an empty
// key set is an error wrapping ErrInvalid.
func NewAuthenticity(keys KeySet) (*Authenticity, error) {
	if len(keys.keys) == 0 {
		return nil, fmt.Errorf("authenticity: %w: no pinned broker key", ErrInvalid)
	}
	return &Authenticity{keys: keys}, nil
}

// VerifyReceipt checks r's envelope against the pinned keys (VerifyReceipt)
// and that it is the receipt of job; r.Receipt must be the envelope's
// receipt. The error is a *VerifyError naming the check that failed (or
// ctx's error).
func (a *Authenticity) VerifyReceipt(ctx context.Context, r SignedReceipt, job Job) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rc, err := VerifyReceipt(a.keys, r.Envelope, job)
	if err != nil {
		return err
	}
	return sameDecoded("receipt", r.Receipt, rc)
}

// VerifyResult checks r's envelope against the pinned keys, that it is a
// result of job, and that it is chained to r.Receipt, itself the verified
// receipt of job (VerifyResult); r.Result and r.Receipt.Receipt must be the
// envelopes' values. An uncertain result verifies: its status says what it
// proves.
func (a *Authenticity) VerifyResult(ctx context.Context, r SignedResult, job Job) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.VerifyReceipt(ctx, r.Receipt, job); err != nil {
		return fmt.Errorf("receipt: %w", err)
	}
	res, err := VerifyResult(a.keys, r.Envelope, job, r.Receipt.Envelope)
	if err != nil {
		return err
	}
	return sameDecoded("result", r.Result, res)
}

// sameDecoded refuses a decoded value that differs from the one its
// envelope carries: a caller could otherwise pair one job's envelope with
// another's values.
func sameDecoded(what string, got, signed any) error {
	g, err := CanonicalJSON(got)
	if err != nil {
		return verifyErr(CheckPredicate, "%s: %v", what, err)
	}
	s, err := CanonicalJSON(signed)
	if err != nil {
		return verifyErr(CheckPredicate, "%s: %v", what, err)
	}
	if !bytes.Equal(g, s) {
		return verifyErr(CheckPredicate, "the decoded %s is not the one its envelope carries", what)
	}
	return nil
}
