// Package verifier is a minimal verifier that uses sandboxd as its
// sandboxed test backend, built from sandboxd's public packages only
// (sandbox and sandbox/client): it defines the seed verification
// package's ports as the seed names them (Runner, SandboxAuthenticity,
// SandboxSupervisor), registers a plan from a packed bundle and a candidate
// workspace, and implements EvaluateTests: dispatch the reserved candidate
// job, wait, authenticate its receipt and result with the pinned key,
// build and dispatch the grader job on the candidate's verified export,
// authenticate, ask the supervisor, and return a check result bound to the
// plan's digest.
//
// It is an example to copy from, not a library to depend on; README.md
// shows how to wire your own and how each port differs from the seed's.
package verifier
