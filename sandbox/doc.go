// Package sandbox is the public surface of sandboxd: the sealed Job a caller
// submits, the Result the broker reports, their canonical JSON encoding and
// digests, and the sentinel errors callers branch on.
//
// A verifier imports only this package (and sandbox/client). It must never
// import the container engine client or anything under internal/: what it
// needs to check a broker's work is here.
package sandbox
