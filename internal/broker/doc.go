// Package broker runs sealed sandbox.Jobs on the local container engine and
// reports, from outside, exactly what happened.
//
// # How files cross the boundary
//
// The engine facts measured on this machine rule out the obvious designs:
// the archive API cannot write into a read-only volume or a read-only root
// filesystem, files copied into a tmpfs-backed volume before start are gone
// at start, `docker cp` cannot read a --tmpfs mount of a running container,
// and the writable layer cannot be size-limited. So:
//
//   - Read-only inputs (the evaluator bundle, a candidate's export) are
//     engine volumes populated once per content digest through a created,
//     never-started helper container, read back and compared file by file
//     with the input before first use, and mounted read-only (NoCopy).
//     A volume that fails the check is removed and rebuilt, never used.
//   - Scratch space is tmpfs (/work, /tmp) with a size, so disk use is
//     bounded and vanishes with the container. The exec service's code uid
//     has a tmpfs of its own (/.code-tmp, its $TMPDIR) and cannot write
//     the candidate's (the grader's) scratch space.
//   - The in-container helper (package shim), a static binary on its own
//     read-only volume, is the entrypoint. Over the attached stdin the broker
//     sends a config frame and the writable inputs; over stdout the helper
//     sends framed command output and, after every candidate process is
//     dead, the output files. The candidate runs as another uid with no
//     capabilities and never holds the container's stdout.
//   - Everything the helper sends is untrusted: the broker re-checks each
//     path, type, count and size against the job's limits and computes
//     every digest itself while streaming into the blob store. What it
//     quotes of it in a result is bounded, and a result that would be
//     signed over sandbox.MaxResultBytes loses the artifacts that take it
//     over (fitResult): the job's limits should already prevent that.
//
// # Authority
//
// The wall-clock deadline is enforced from outside (the container is
// killed), OOM comes from the engine's State.OOMKilled, and the container's
// security settings are read back by inspect before start: a container that
// differs from what was asked is removed and the job ends "error" naming the
// setting. Images are used by local ID only and never pulled.
//
// # Sandboxes started ahead of jobs
//
// With Config.PoolSize, the broker keeps started sandboxes ready for the
// container shapes jobs used (pool.go): the helper learns its job only from
// the config frame, so a container started before its job is the same
// container. A job takes one only if the sandbox's spec is its own (the
// pool key is the digest of the spec), it is inspected and checked against
// the job's spec again when taken, and each serves one job. Jobs with
// read-only inputs are never pooled.
//
// The broker must never bind-mount host paths, pass the host environment,
// follow a link out of an output directory, or leave a container or volume
// of a job behind on any path (success, failure, timeout, cancellation or
// panic).
package broker
