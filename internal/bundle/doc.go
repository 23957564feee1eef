// Package bundle turns file trees into sandboxd's one canonical tar form and
// back into checked facts: evaluator bundles (a directory with bundle.json,
// packed as an OCI image-layout artifact whose digest is the bundle's
// identity) and candidate workspaces (a directory or a tar, ingested under
// the reader rules). Both share one writer and one checker, so the broker
// can re-check any input tar with CheckTar before staging it.
//
// Workspace ingestion lives here rather than in its own package because it
// is the same tar form, the same name rules, the same ceilings and the same
// error vocabulary as bundle packing; splitting it would mean exporting the
// internals both depend on.
//
// This package must never trust a name, a size, a link or a digest it was
// given: every digest it returns is computed from the bytes it read, a
// caller's digest is only a claim to compare, and nothing it refuses is
// committed to a store. It never extracts a tree onto the host, never
// follows a link out of the tree it reads, and never talks to the container
// engine (the engine-side bundle cache belongs to the broker).
package bundle
