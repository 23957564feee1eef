// Package probe is what the sandboxd-probe program does inside a sandbox:
// it tries, from the candidate's seat, every way out that sandboxd claims is
// closed (the denied syscalls, raw and vsock sockets, /proc and cgroup
// writes, the network, the host's resolver, leaked environment and mounts)
// and records what the kernel answered, as a Report.
//
// The probe only observes. Every attempt uses arguments that stay harmless
// inside any container even when the call is allowed (a mount over a fresh
// temporary directory, a file opened for writing but never written), and it
// must never be run directly on a host. Judging the report is the job of
// package selfcheck, which imports only the types here.
package probe
