// Package fleet is sandboxd's fleet: many daemons on many hosts taking
// sealed jobs from one queue, each job run at most once fleet-wide.
//
// What is distributed is the sealed job and its outcome, never authority:
// every host keeps its own security table, journal, pool and signing key,
// and signs what it accepts and what it saw. The fleet's state lives in a
// Coordinator; JetStream (NATS) is the one implementation here, and its
// wire forms (the Record, the Host) are what a second one (a Kubernetes
// resource, say) must keep.
//
// A job's life in the fleet is one Record, changed only by compare-and-set
// on its revision:
//
//	queued   a submitter bound the id to the digest and queued the job
//	claimed  a host took it (Host), then journaled it and signed its receipt
//	ended    a host signed its result: the one that ran it, or one that saw
//	         the claiming host's lease expire (the job then ends uncertain
//	         and never runs elsewhere)
//
// A job message is delivered at least once; the claim makes it run at most
// once: a host runs a job only under its own claim, and a redelivered
// message of a job claimed by another host only checks that host's lease.
//
// The package imports sandbox and the NATS client only; a verifier uses its
// Runner as it uses sandbox/client.
package fleet
