// Package selfcheck proves, on the engine at hand, that the sandbox holds:
// it runs the probe (package probe, built as cmd/sandboxd-probe) through
// the broker exactly like a candidate job, evaluates every isolation
// property from the probe's report, from the broker's inspected settings
// and from what the host itself saw (a loopback listener the sandbox must
// not reach), and names each property that does not hold.
//
// A passing check is cached in a file under the state directory, keyed by
// everything that could change the answer: engine and kernel version, the
// versions of the engine's parts, this host's boot (a reboot checks again),
// seccomp profile, image, runtime, probe, helper and broker version. A
// failure is never cached. Gate is the one place `run`, `exec` and `serve`
// ask for a check: once per engine, image and runtime in a process, with
// concurrent first jobs of one image sharing the check and other images'
// jobs never waiting for it. selfcheck must never loosen a property to
// make a check pass, and must never treat a report it could not obtain as
// a pass.
package selfcheck
