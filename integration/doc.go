// Package integration holds sandboxd's end-to-end tests against the real
// container engine of this machine: the broker's outcomes, its isolation
// and its cleanup. With CI=true a missing engine fails the suite; it is
// never skipped there.
//
// Tests that probe network isolation look only at interfaces and loopback
// inside the sandbox and at a listener on the host's loopback; they never
// aim traffic at any other address.
package integration
