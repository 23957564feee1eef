// Package receipt signs what the broker accepted and what happened to a job:
// in-toto Statement v1 attestations in DSSE envelopes, signed with ECDSA
// P-256 through sigstore, and the cosign-compatible key files behind them.
//
// It never verifies on behalf of a caller (verification lives in the
// public sandbox package, standard library only) and it never reads a
// password from the environment or a terminal: cmd/ passes the bytes in.
package receipt
