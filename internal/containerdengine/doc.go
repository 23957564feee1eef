// Package containerdengine is the broker's engine on containerd's client
// API, for hosts where dockerd's own cost (its container start, network
// setup and attach stream) is most of a job.
//
// It implements the broker's narrow, moby-shaped Engine interface as a
// translator, so that everything above the engine is shared: create options
// become an OCI runtime spec (spec.go) that refuses, by name, any setting
// it cannot express; inspect reports the spec read back from containerd in
// Docker's terms (inspect.go), so the broker's own comparison applies
// unchanged, and the read-back spec is also checked directly against every
// row of the security table before a task is made (checkSandboxSpec), and
// compared, field for field, with the spec made again from the create
// options the engine keeps for the container outside containerd's record
// (checkRecord), so that nothing the rows do not read slips in.
// Volumes are engine-owned directories bind-mounted read-only; a task's
// stdout and stderr are files the shim writes, so a job's stream survives
// this process as Docker's log does; names are leases, so a second create
// or a rename onto a taken name conflicts; images are imported from the
// local Docker engine by ID (never pulled) and every job of an image shares
// one read-only view snapshot of it.
//
// It works only in its own containerd namespace and never touches "moby",
// dockerd's. It must never mount a host path other than its own volume
// directories, and never start a task whose spec fails either check.
package containerdengine
