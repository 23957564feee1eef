// Package evidence defines the evidence directory that `sandboxd run --out`
// writes and `sandboxd assess` re-judges: index.json (what is where), the
// job files with their signed receipts and results, the logs, the
// collected artifacts by digest, each assessment, and the signed in-toto
// test-result statement.
//
// Write puts an evaluation's outcome into a directory all at once (a
// directory is absent or complete). Open and Check read one back trusting
// only the pinned keys and the bundle given: every envelope verifies, every
// job is the bundle's, every artifact used re-hashes, and the supervisor's
// recomputed assessments must be the directory's byte for byte.
//
// Check never trusts index.json for anything it can verify or recompute:
// the index only says where files are, and everything it claims is
// compared with the signed and recomputed facts. It never reads a file
// past the size a signed result gives, never follows a path out of the
// directory, and never reads a verdict from stdout or stderr.
package evidence
