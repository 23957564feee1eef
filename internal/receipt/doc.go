// Package receipt signs what the broker accepted (a receipt) and what
// happened to a job (a result): in-toto Statement v1 attestations in DSSE
// envelopes, signed with ECDSA P-256 / SHA-256 through sigstore, and the
// cosign-compatible key files behind them. The formats and their
// verification live in the public sandbox package, which uses only the
// standard library; this package only produces what sandbox verifies.
//
// It must never sign a job that is not sealed, a result without the
// receipt it is chained to or one over sandbox.MaxResultBytes, never write
// or read an unencrypted private key, and never read a password itself
// (from the environment or a terminal): cmd/ passes the bytes in.
package receipt
