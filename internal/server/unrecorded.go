package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
)

// finishRecord makes a signed result durable; tests replace it to make the
// journal fail.
var finishRecord = (*journal.Journal).Finish

// dispatchRecord journals a dispatch; tests replace it.
var dispatchRecord = (*journal.Journal).Dispatched

// Retry delays of a result the journal refused, and of a job whose
// dispatch it refused.
var (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// unrecorded are the jobs that ended but whose signed result the journal
// has not taken yet: waiting for them answers 503 with the cause, and a
// retry loop records the result as soon as the journal takes it.
type unrecorded struct {
	mu   sync.Mutex
	errs map[string]error
	// attempts counts the dispatches of a job the journal refused.
	attempts map[string]int
}

// attempt returns how many dispatches of id the journal refused so far.
func (u *unrecorded) attempt(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.attempts[id]
}

func (u *unrecorded) refused(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.attempts == nil {
		u.attempts = map[string]int{}
	}
	u.attempts[id]++
}

func (u *unrecorded) dispatched(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.attempts, id)
}

func (u *unrecorded) set(id string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.errs == nil {
		u.errs = map[string]error{}
	}
	u.errs[id] = err
}

func (u *unrecorded) clear(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.errs, id)
}

func (u *unrecorded) get(id string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.errs[id]
}

func (u *unrecorded) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.errs)
}

// ids lists the jobs, sorted.
func (u *unrecorded) ids() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.errs))
	for id := range u.errs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (s *Server) registerUnrecorded() {
	s.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxd_results_unrecorded", Help: "Jobs that ended but whose signed result the journal has not taken yet."},
		func() float64 { return float64(s.pending.count()) }))
}

// errNotRecorded marks a job that ended but whose result is not durable.
var errNotRecorded = errors.New("its result is not recorded")

// errUnrecorded is what a wait for a job in s.pending answers.
func (s *Server) errUnrecorded(id string) error {
	err := s.pending.get(id)
	if err == nil {
		return nil
	}
	return fmt.Errorf("job %s ended, but %w (%v); the daemon retries, and if it stops first, its next start recovers the job from its container", id, errNotRecorded, err)
}

// record makes res durable, or, if the journal refuses it, keeps retrying
// in the background until the journal takes it or the server stops (then
// the job's container, kept, lets the next start recover it). containerID
// is the container the broker kept for it ("" if none): it is removed
// once the result is durable.
func (s *Server) record(log *slog.Logger, rec journal.Record, res sandbox.Result, containerID string) {
	err := s.finish(log, rec, res)
	if err == nil {
		return
	}
	s.retryRecord(log, rec, res, containerID, err)
}

// While it retries, nothing durable names the result's artifacts and logs
// and the broker's hold on them is gone: they stay pinned until the journal
// takes the result, or no GC would spare them.
func (s *Server) retryRecord(log *slog.Logger, rec journal.Record, res sandbox.Result, containerID string, first error) {
	log.Error("result not recorded; retrying", "error", first, "container_id", containerID)
	unpin := s.cfg.Blobs.Pin(resultBlobs(res)...)
	s.pending.set(rec.ID, first)
	s.notifyChanged() // a waiter learns why at once
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		defer unpin()
		delay := retryFirst
		for {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.closing:
				t.Stop()
			}
			err := s.finish(log, rec, res)
			if err == nil {
				s.pending.clear(rec.ID)
				log.Info("result recorded after a retry")
				if containerID != "" {
					s.cfg.Broker.RemoveJobContainer(containerID)
				}
				return
			}
			s.pending.set(rec.ID, err)
			select {
			case <-s.closing:
				log.Error("result still not recorded at shutdown; the next start recovers the job", "error", err, "container_id", containerID)
				return
			default:
			}
			delay = min(2*delay, retryMax)
		}
	}()
}

// resultBlobs are the blobs a result names: its artifacts and logs.
func resultBlobs(res sandbox.Result) []string {
	ds := make([]string, 0, len(res.Artifacts)+2)
	for _, a := range res.Artifacts {
		ds = append(ds, a.Digest)
	}
	for _, d := range []string{res.Stdout.Digest, res.Stderr.Digest} {
		if d != "" {
			ds = append(ds, d)
		}
	}
	return ds
}

// errPendingAtShutdown reports the jobs whose results are still not
// recorded when the server stops.
func (s *Server) errPendingAtShutdown() error {
	ids := s.pending.ids()
	if len(ids) == 0 {
		return nil
	}
	return fmt.Errorf("the results of %d jobs could not be recorded (%s); their containers are kept and the next start recovers them", len(ids), strings.Join(ids, ", "))
}

// dispatchLater puts an accepted job back in the queue after a delay: the
// journal could not be read or could not record its dispatch, so it
// provably did not run. If the server stops first, it stays accepted and
// the next start queues it.
func (s *Server) dispatchLater(log *slog.Logger, id string, err error) {
	delay := min(retryFirst<<min(s.pending.attempt(id), 10), retryMax)
	s.pending.refused(id)
	log.Error("job not dispatched; it stays accepted and is queued again", "error", err, "retry_in", delay.String())
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			s.enqueue(id, false)
		case <-s.closing:
		}
	}()
}

// undecodable ends a journaled job whose JSON no longer decodes: it cannot
// run, and its signed result says why.
func (s *Server) undecodable(log *slog.Logger, rec journal.Record, err error) {
	log.Error("journaled job does not decode; ending it with an error", "error", err)
	facts, ferr := s.cfg.Broker.Facts(context.Background())
	if ferr != nil {
		log.Warn("runtime facts", "error", ferr)
	}
	now := time.Now().UTC()
	res := sandbox.Result{
		Schema: sandbox.ResultSchema, JobID: rec.ID, JobDigest: rec.Digest,
		Status: sandbox.StatusError, Cause: "the journaled job does not decode: " + err.Error(), StartedAt: now, EndedAt: now, Runtime: facts,
		LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{},
	}
	s.record(log, rec, res, "")
}
