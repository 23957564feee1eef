// Package archtest holds tests of the repository's shape: every package has
// exactly one package comment, in doc.go, and the "never" edges of the
// package map (internal/README.md) hold: what a verifier imports, what
// judges and what signs never reach the broker or the engine client, and
// the broker never judges; and no function in a non-test file under cmd/
// is longer than 80 lines (funclen_test.go). It contains no code.
package archtest
