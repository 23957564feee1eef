// Package enginefake is an in-memory container engine with the methods the
// broker calls (broker.Engine), for unit tests of the logic above the
// engine: the spec check, the pool and recovery. Containers hold the
// settings they were created with and report them back on inspect with the
// defaults a real engine adds; volumes hold files; a started container
// runs a Go function in place of its entrypoint, with its stdio attached.
// A test can make the engine report settings other than those asked for,
// to prove they are refused.
//
// It is a fake for tests only: nothing outside _test.go files may import
// it, and it never isolates anything. The engine suites in integration/
// remain the proof that the real engines apply what the broker asks.
package enginefake
