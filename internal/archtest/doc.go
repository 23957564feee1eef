// Package archtest holds tests of the repository's shape: every package has
// exactly one package comment, in doc.go, and the "never" edges of the
// package map (internal/README.md) hold: what a verifier imports, what
// judges and what signs never reach the broker or the engine client, and
// the broker never judges. It contains no code.
package archtest
