// Package testharness sets up what sandboxd's engine tests share: the real
// engine (a failure under CI=true when it does not answer, never a skip),
// the helper binary and minimal image built from this checkout, a blob
// store, a broker with a unique name, and a check at the end that nothing
// the tests created is left in the engine.
//
// It is internal (not integration/harness) so that no other module builds
// on it; the engine suites in integration/ and cmd/sandboxd's scripts are
// its only users.
package testharness
