// Package client talks to a sandboxd daemon over its unix socket (or
// mutual-TLS TCP) and implements sandbox.Runner: every receipt and result
// it returns was verified against the broker keys the caller pinned.
//
// It never allocates a job identity and never resubmits a job under
// another one: an ambiguous outcome (a request that may or may not have
// reached the daemon, a wait cut short) is an error wrapping
// sandbox.ErrUncertain, to be reconciled with the same job.
package client
