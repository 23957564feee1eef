package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// recover reads the journal and settles every job a previous process left
// unfinished, in the pattern of Nomad's docker driver (recover handles,
// then reap):
//   - accepted, never dispatched: provably never ran; queued again, in
//     the order they were accepted;
//   - dispatched, created or started with a container: the broker
//     recovers it (waits for a running one under its deadline, reads the
//     helper's stream back); it is never started again, unless the broker
//     proves it never ran (broker.ErrNotRun: the container never started,
//     or the helper's stream ends before the command's start): then it is
//     accepted again and queued, and runs for the first time;
//   - dispatched without a container bound: it never ran (the broker
//     starts nothing before the binding is durable); a container of its
//     name is removed, and it is queued again;
//   - bound to a container that no longer exists: no proof of what
//     happened; ends uncertain.
func (s *Server) recover(ctx context.Context) error {
	recs, err := s.cfg.Journal.List()
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	s.sweepOrphans(recs)
	var open []journal.Record
	bound := map[string]bool{}
	openIDs := map[string]bool{}
	for _, r := range recs {
		if !r.State.Terminal() {
			open = append(open, r)
			openIDs[r.ID] = true
			if r.ContainerID != "" {
				bound[r.ContainerID] = true
			}
		}
	}
	s.removeLeftovers(ctx, openIDs)
	s.mu.Lock()
	s.bound = bound
	s.mu.Unlock()
	if len(open) == 0 {
		return nil
	}
	cs, err := s.cfg.Broker.ListJobContainers(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	byJob := map[string]broker.JobContainer{}
	for _, c := range cs {
		byJob[c.JobID+"@"+c.JobDigest] = c
	}
	var requeue []journal.Record
	for _, rec := range open {
		log := s.log.With("job_id", rec.ID)
		job, err := rec.DecodeJob()
		if err != nil {
			log.Error("journaled job does not decode; left as is", "error", err)
			continue
		}
		cid := rec.ContainerID
		if cid == "" {
			if c, ok := byJob[rec.ID+"@"+rec.Digest]; ok && rec.State != journal.Accepted {
				cid = c.ID // created, but killed before the id was journaled
			}
		}
		switch {
		case rec.State == journal.Accepted && rec.CancelRequested:
			s.m.reconcile.WithLabelValues("cancelled").Inc()
			s.finishUnrun(log, rec, job, sandbox.StatusCancelled, "cancelled before it was dispatched")
		case rec.State == journal.Accepted:
			requeue = append(requeue, rec)
		case cid == "" && rec.State == journal.Dispatched:
			// No container was bound to it, and the broker starts one (or
			// sends a pooled sandbox its config) only once the binding is
			// durable: it never ran. A container of its name (a create
			// whose id was not journaled yet, a pooled sandbox renamed to
			// it) is removed, and it runs for the first time. A create
			// (or rename) still in flight in the engine may land after
			// this: the run removes what it left and creates again
			// (journal.Record.Requeued, broker.Hooks.ReclaimName);
			// anything else of the name makes it conflict (uncertain),
			// never run twice.
			removed, err := s.cfg.Broker.RemoveUnboundContainer(job)
			if err != nil {
				s.m.reconcile.WithLabelValues("uncertain").Inc()
				s.finishUnrun(log, rec, job, sandbox.StatusUncertain, "the daemon stopped after dispatching the job, and a container of its name could not be removed: "+err.Error())
				continue
			}
			if _, err := s.cfg.Journal.NotRun(rec.ID); err != nil {
				log.Error("journal a dispatched job that never ran; left for the next start", "error", err)
				continue
			}
			s.m.reconcile.WithLabelValues("not_run").Inc()
			// removed_container: a container of its name was there (its
			// create had been made; the job's run will make another).
			log.Info("the job never ran; queued to run", "why", "dispatched, no container bound", "removed_container", removed)
			requeue = append(requeue, rec)
		case cid == "":
			s.m.reconcile.WithLabelValues("uncertain").Inc()
			log.Warn("a job past its dispatch has no container; ending it uncertain")
			s.finishUnrun(log, rec, job, sandbox.StatusUncertain, "the daemon stopped after the job's container was bound and no container of it exists; what happened cannot be proven, and it is not run again")
		default:
			s.m.reconcile.WithLabelValues("recovered").Inc()
			s.startRecovery(rec, job, cid)
		}
	}
	slices.SortFunc(requeue, journal.AcceptanceOrder)
	for _, rec := range requeue {
		s.m.reconcile.WithLabelValues("requeued").Inc()
		s.log.Info("requeued accepted job", "job_id", rec.ID)
		s.markRequeued(rec.ID)
		s.enqueue(rec.ID, false)
	}
	return nil
}

// removeLeftovers removes, before this process runs anything, what only a
// live process of this broker uses and no journal record names: the
// containers filling cache volumes and the isolation selfcheck's job
// containers (never journaled), each left by an earlier process killed
// mid-way (a daemon owns its broker name). The reaper would take a
// selfcheck's only past its deadline, and a populate container never:
// meanwhile each held the volumes it mounts, a half-filled one could not
// be filled again, and the selfcheck (and every job needing the volume)
// ended error. What it cannot remove is said and left (the daemon still
// starts: a job needing such a volume ends error, naming it).
func (s *Server) removeLeftovers(ctx context.Context, open map[string]bool) {
	n, err := s.cfg.Broker.RemovePopulateContainers(ctx)
	if err != nil {
		s.log.Warn("remove the populate containers an earlier process left", "error", err)
	}
	cs, err := s.cfg.Broker.ListJobContainers(ctx)
	if err != nil {
		s.log.Warn("list the selfcheck containers an earlier process left", "error", err)
	}
	for _, c := range cs {
		if strings.HasPrefix(c.JobID, broker.SelfcheckJobPrefix) && !open[c.JobID] {
			s.cfg.Broker.RemoveJobContainer(c.ID)
			n++
		}
	}
	if n > 0 {
		s.m.reconcile.WithLabelValues("reaped").Add(float64(n))
		s.log.Info("removed what an earlier process left running (populate, selfcheck)", "containers", n)
	}
}

// startRecovery finishes a job through broker.Recover in the background.
func (s *Server) startRecovery(rec journal.Record, job sandbox.Job, containerID string) {
	log := s.log.With("job_id", rec.ID, "container_id", containerID)
	s.mu.Lock()
	// Its container runs: it holds a slot from now until it ends, and is
	// cancelled by nothing (its deadline label still holds).
	s.running[rec.ID] = func() {}
	s.recovering++
	s.setRunningLocked()
	s.mu.Unlock()
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		rerun := false
		defer func() {
			if rerun { // once its slot is free, in its place
				s.markRequeued(rec.ID)
				s.enqueueInOrder(rec)
			}
		}()
		defer func() {
			s.mu.Lock()
			s.recovering--
			s.mu.Unlock()
			s.freeSlot(rec.ID)
		}()
		start := time.Now()
		log.Info("recovering job")
		// The result is made durable while the container still exists;
		// if that fails, the container stays for the next start.
		bridge := func() {}
		hooks := broker.Hooks{OnFinished: func(ctx context.Context, res sandbox.Result) error {
			s.observeDuration(time.Since(start))
			return s.finishHeld(log, rec, res, &bridge)
		}}
		res, err := s.cfg.Broker.RecoverWithHooks(context.Background(), job, broker.Binding{ContainerID: containerID, StartedAt: rec.StartedAt}, hooks)
		defer bridge()
		switch {
		case errors.Is(err, broker.ErrNotRun):
			// Proven never run, its container removed: it runs now, for
			// the first time, its deadline counted from its new start.
			if _, jerr := s.cfg.Journal.NotRun(rec.ID); jerr != nil {
				log.Error("journal a job that never ran; left for the next start", "error", jerr)
				return
			}
			s.m.reconcile.WithLabelValues("not_run").Inc()
			log.Info("the job never ran; queued to run", "why", err)
			rerun = true
		case err != nil && res.JobID != "":
			// Recovered, but the journal refused the result: retried.
			s.retryRecord(log, rec, res, containerID, err)
		case err != nil:
			log.Error("recover job; left for the next start", "error", err)
		}
	}()
}

// reapLoop removes, after the grace period and then periodically,
// labelled job containers the journal does not know or has ended.
func (s *Server) reapLoop(ctx context.Context) {
	t := time.NewTimer(s.cfg.ReapGrace)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.reap(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("reap", "error", err)
		}
		t.Reset(s.cfg.ReapInterval)
	}
}

// reap removes job containers of this broker that no live job owns and that
// are older than the grace period, then ends the engine's processes that
// serve no container (whether or not the removals went well).
func (s *Server) reap(ctx context.Context) error {
	err := s.reapContainers(ctx)
	return errors.Join(err, s.endOrphanedShims(ctx))
}

func (s *Server) reapContainers(ctx context.Context) error {
	cs, err := s.cfg.Broker.ListJobContainers(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if time.Since(c.Created) < s.cfg.ReapGrace {
			continue
		}
		rec, err := s.cfg.Journal.Get(c.JobID)
		switch {
		case errors.Is(err, sandbox.ErrNotFound):
		case err != nil:
			return err
		case rec.Digest == c.JobDigest && !rec.State.Terminal():
			continue // a live job's, or one being recovered
		}
		if errors.Is(err, sandbox.ErrNotFound) && time.Now().Before(c.Deadline) {
			// Unknown, but within its deadline: it may be a job of another
			// process of the same broker name; its deadline label says
			// when it can no longer be one.
			continue
		}
		s.m.reconcile.WithLabelValues("reaped").Inc()
		s.log.Warn("reaping unknown job container", "container_id", c.ID, "job_id", c.JobID, "state", c.State)
		s.cfg.Broker.RemoveJobContainer(c.ID)
	}
	// Sandboxes an earlier process started ahead of jobs, and those this
	// one lost track of: those the journal bound to a job at start are
	// recovered (and removed) with the job; no job ever runs in the others.
	stale, err := s.cfg.Broker.ListStalePoolContainers(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	bound := s.bound
	s.mu.Unlock()
	for _, c := range stale {
		if time.Since(c.Created) < s.cfg.ReapGrace || bound[c.ID] {
			continue
		}
		s.m.reconcile.WithLabelValues("reaped").Inc()
		s.log.Info("reaping a stale pooled sandbox", "container_id", c.ID, "state", c.State)
		s.cfg.Broker.RemoveJobContainer(c.ID)
	}
	return nil
}

// endOrphanedShims ends the processes of task creates cut short (an
// earlier process killed in one), which no container reaches any more.
func (s *Server) endOrphanedShims(ctx context.Context) error {
	e, ok := s.cfg.Broker.(broker.ShimEnder)
	if !ok {
		return nil
	}
	ended, err := e.EndOrphanedShims(ctx)
	for _, id := range ended {
		s.m.reconcile.WithLabelValues("shim_ended").Inc()
		s.log.Warn("ended the shim of a container that no longer exists", "container_id", id)
	}
	if err != nil {
		return fmt.Errorf("end orphaned shims: %w", err)
	}
	return nil
}

// markRequeued notes a job a restart queued again, proven never run here.
func (s *Server) markRequeued(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.requeued == nil {
		s.requeued = map[string]bool{}
	}
	s.requeued[id] = true
}

func (s *Server) fleetSilentSince() time.Time {
	s.fleetSilentMu.Lock()
	defer s.fleetSilentMu.Unlock()
	return s.fleetSilent
}

func (s *Server) setFleetSilent(at time.Time) {
	s.fleetSilentMu.Lock()
	s.fleetSilent = at
	s.fleetSilentMu.Unlock()
}

// requeuedReadWait bounds the read of a requeued job's fleet record, and
// is how long a fleet that did not answer one is not asked again.
const requeuedReadWait = 10 * time.Second

// takeRequeued reports whether id was queued again by a restart, once.
func (s *Server) takeRequeued(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.requeued[id]
	delete(s.requeued, id)
	return was
}

// endedByTheFleet reports whether the fleet no longer has this host run a
// job a restart queued again: while this host was away, another saw its
// lease lapse and ended the job uncertain, or the record is not this
// host's claim (another host's, or queued: another host may take it, and
// the job would run twice), or the fleet holds another job under its id.
// Only a record claimed by this host lets it run, or a fleet that cannot
// be read, as before: a claim of this host's must not be lost to a read
// that failed.
//
// A fleet that did not answer is not asked again for requeuedReadWait:
// the requeued jobs after it would each wait that long, and then run all
// the same (a restart with many of them and no quorum would start them
// one wait at a time).
func (s *Server) endedByTheFleet(ctx context.Context, rec journal.Record) (string, bool) {
	if s.cfg.Fleet == nil {
		return "", false
	}
	if at := s.fleetSilentSince(); !at.IsZero() && time.Since(at) < requeuedReadWait {
		s.log.Warn("fleet: not asked about a job queued again, since it did not answer a moment ago; it runs", "job_id", rec.ID)
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, requeuedReadWait)
	defer cancel()
	co, err := s.cfg.Fleet.Coordinator.Tenant(ctx, rec.Tenant)
	var fr fleet.Record
	if err == nil {
		// A stream (or the cluster's metadata) without a leader for a
		// moment answers at once that it cannot: asked again within
		// requeuedReadWait.
		for {
			fr, err = co.Record(ctx, rec.ID)
			if !errors.Is(err, fleet.ErrUnavailable) || !pause(ctx, 250*time.Millisecond) {
				break
			}
		}
	}
	if err != nil {
		if errors.Is(err, fleet.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			s.setFleetSilent(time.Now())
		}
		s.log.Warn("fleet: read the record of a job queued again; it runs", "job_id", rec.ID, "error", err)
		return "", false
	}
	s.setFleetSilent(time.Time{})
	switch {
	case fr.Digest != rec.Digest:
		return fmt.Sprintf("the fleet's job %s is another (%s) than the one this host accepted; it never ran here and is not run", rec.ID, fr.Digest), true
	case fr.State == fleet.StateEnded:
		return fmt.Sprintf("the fleet ended it (%s, by host %s) while this host was away; it never ran here and is not run again", fr.Status, fr.EndedBy), true
	case fr.State != fleet.StateClaimed || fr.Host != s.cfg.Name:
		return fmt.Sprintf("the fleet has it %s (host %q), not claimed by this host; it never ran here and is not run", fr.State, fr.Host), true
	}
	return "", false
}
