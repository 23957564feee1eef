// Package sandbox is the public surface of sandboxd: the sealed Job a caller
// submits, the Result the broker reports, their canonical JSON encoding and
// digests, signed receipts, results and assessments and their verification
// against pinned keys, and the sentinel errors callers branch on.
//
// A verifier imports only this package (and sandbox/client). It must never
// import the container engine client or anything under internal/: what it
// needs to check a broker's work is here. examples/verifier is a module of
// its own that plays a verifier with these two packages alone.
//
// # The verifier's names and sandboxd's
//
// The verification package sandboxd serves (its SandboxTestVerifier) names
// a sandbox.Job, sandbox.Receipt, sandbox.Result and sandbox.Runner, and
// three ports. They map onto this package as follows:
//
//   - its sandbox.Job is Job: sealed, its Digest binding every field, its
//     ID reserved by the caller.
//   - its sandbox.Receipt, "the thing that authenticates", is SignedReceipt:
//     the DSSE envelope and the Receipt decoded from it. Here Receipt is
//     only the decoded predicate (what the broker accepted, when, under
//     which runtime); it carries no signature and proves nothing alone.
//   - its sandbox.Result likewise is SignedResult (the completed envelope,
//     the decoded Result, and the SignedReceipt it is chained to). Result
//     here is the decoded predicate.
//   - its sandbox.Runner is Runner, with SignedReceipt and SignedResult in
//     those places; sandbox/client's Client is one.
//   - its SandboxAuthenticity (VerifyReceipt, VerifyResult over pinned
//     broker keys) is Authenticity, with exactly those two methods over
//     SignedReceipt and SignedResult. It also refuses a signed value whose
//     decoded half is not its envelope's.
//   - its SandboxSupervisor.Assess answers a SandboxAssessment; the daemon's
//     POST /v1/assess answers a signed Assessment (PredicateAssessment, see
//     VerifyAssessment) with the same fields: ManifestDigest (the bundle's
//     digest, which the verifier's evaluation manifest pins),
//     SupervisorRevision, CandidateDigest, GraderDigest, Checks (each with
//     its status and the digests of the evidence it rests on) and
//     ObservationRefs. sandbox/client's Client.Assess verifies it.
//   - its "verified candidate export appended at /inputs/candidate-export
//     before the grader job is sealed again" is WriteCandidateExport (the
//     export's canonical tar, the bytes the daemon rebuilds) and GraderJob
//     (template + export → sealed grader job), at CandidateExportPath.
//   - its ErrCallUncertain is, at this level, ErrUncertain: an outcome the
//     broker or the client cannot prove. Reconcile with the same job.
//
// # Plans from bundles
//
// The jobs a bundle prescribes (and the manifest digest a verifier
// registers) come from the daemon: POST /v1/plan, sandbox/client's
// Client.Plan, answers a Plan for a bundle's bytes, a workspace digest and
// the reserved ids, and runs nothing. It is an endpoint rather than a
// second implementation in this package on purpose: the daemon's assess
// endpoint judges only the jobs it rebuilds from the bundle, so the one
// definition of those jobs must be the one the daemon uses, and a public
// copy of the bundle reader (OCI layout, strict bundle.json, its limits)
// could drift from it and make a verifier dispatch jobs that can never be
// judged. The answer is not trusted blindly: Plan.Check binds it to the
// request (the bundle manifest's digest, the ids, the workspace), and a
// verifier compares the required checks with its own manifest's before
// anything runs.
package sandbox
