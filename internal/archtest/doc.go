// Package archtest holds tests of the repository's shape: every package has
// exactly one package comment, in doc.go, and the packages a verifier
// trusts never link the container engine client. It contains no code.
package archtest
