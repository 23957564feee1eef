// Package server is the sandboxd daemon: a JSON API under /v1 (unix socket
// or mutual-TLS TCP) in front of one broker, a durable job journal, a
// bounded FIFO queue with a concurrency limit, recovery of the jobs a
// previous process left behind, a reaper of labelled containers the
// journal does not know, and Prometheus metrics.
//
// Concurrency is a budget of slots that jobs recovered as running hold
// as dispatched ones do, so that a daemon restarted while jobs run never
// runs more than Concurrency at once; the queue is dispatched in
// acceptance order, across restarts too.
//
// The server never runs a job twice and never runs one it cannot prove has
// not run: a job is handed to the broker only after the journal durably
// says so, and a job whose outcome cannot be proven ends uncertain.
//
// Shutdown (SIGTERM in `sandboxd serve`): new submissions are refused with
// 503, queued jobs stay accepted in the journal and run after the next
// start, and running jobs are given DrainTimeout to finish. Jobs still
// running after that are left to their containers: their deadlines are
// labels the engine keeps, and the next start recovers them from the
// journal (their goroutines end with the process; that is the one place
// a goroutine is not waited for, and the journal is what makes it safe).
package server
