// Package journal is the daemon's durable record of jobs: for each job id,
// the sealed job, its signed receipt, how far it got (accepted, dispatched,
// created with a container id, started, finished or uncertain) and its
// signed result. Every transition is committed with fsync (bbolt's default)
// before the caller performs the side effect it permits, so a restarted
// daemon knows, for every job, what may have happened.
//
// The journal never talks to the engine and never signs anything; it must
// never forget or rewrite a job once accepted: a job id, once bound to a
// digest, stays bound to it.
package journal
