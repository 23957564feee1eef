// Package helper is sandboxd's in-container helper, the program behind the
// sandboxd-shim binary. It speaks the protocol of package shim with the
// broker over the container's stdio. The daemon never links it
// (internal/archtest checks that cmd/sandboxd does not).
//
// The engine cannot copy files into a size-bounded tmpfs before start, nor
// read them out of one afterwards, so the helper does both while the
// container runs. It is a static binary mounted read-only from a
// broker-owned volume and runs as the container's entrypoint (under
// docker-init) as root holding only CAP_SETUID and CAP_SETGID. It:
//
//  1. reads a Config frame and the writable inputs (length-delimited tars)
//     from stdin and extracts them into tmpfs through a child running as the
//     candidate user;
//  2. runs the job's command as the candidate user (no capabilities, no new
//     privileges), relaying its stdout and stderr as framed, capped chunks;
//  3. when the command ends or its deadline passes, kills every process of
//     the candidate user and then, through a collector child of that same
//     uid (so the candidate's file modes cannot hide anything from it),
//     streams regular files of the output directories back as frames.
//
// The container's stdout is the result channel. Only the helper (uid 0) and
// the collector (after every candidate process is dead) ever hold it; the
// candidate writes to pipes, cannot open /proc/<helper>/fd/1 (other uid, no
// ptrace) and cannot signal the helper. The broker treats every frame as
// untrusted input anyway: it re-checks paths, types, counts and sizes and
// computes digests itself.
//
// The helper must never follow a link, never read outside the declared
// output directories and never write outside the declared scratch paths.
package helper
