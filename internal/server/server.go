package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Broker is the part of *broker.Broker the server calls.
type Broker interface {
	Facts(ctx context.Context) (sandbox.RuntimeFacts, error)
	RunWithHooks(ctx context.Context, job sandbox.Job, hooks broker.Hooks) (sandbox.Result, error)
	RecoverWithHooks(ctx context.Context, job sandbox.Job, bind broker.Binding, hooks broker.Hooks) (sandbox.Result, error)
	ListJobContainers(ctx context.Context) ([]broker.JobContainer, error)
	ListStalePoolContainers(ctx context.Context) ([]broker.JobContainer, error)
	RemoveJobContainer(id string)
	RemoveUnboundContainer(job sandbox.Job) (removed bool, err error)
	RemovePopulateContainers(ctx context.Context) (int, error)
}

var _ Broker = (*broker.Broker)(nil)

// Prechecker is a broker that checks a job before the server journals it
// dispatched (the selfcheck gate): a crash during the check leaves the job
// accepted, to run after a restart, never dispatched with no container
// and so ended uncertain.
type Prechecker interface {
	Precheck(ctx context.Context, job sandbox.Job) error
}

// NameHolder is a broker that holds its name on the engine while the
// daemon lives (broker.ClaimName): a second daemon of the name, on another
// state directory, would reap this one's sandboxes.
type NameHolder interface {
	ClaimName(ctx context.Context, holder string) (*broker.NameLease, error)
}

var _ NameHolder = (*broker.Broker)(nil)

var _ broker.ShimEnder = (*broker.Broker)(nil)

// errCancelledByAPI is the cause of a job's context cancelled through the
// API: a job stopped by it before it ran ends cancelled, not error.
var errCancelledByAPI = errors.New("cancelled through the API")

// Server is the daemon. New has no side effects; Start recovers and starts
// the workers; Shutdown stops them.
type Server struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	mux     *http.ServeMux
	keys    sandbox.KeySet
	started time.Time

	mu       sync.Mutex
	queue    []string // accepted job ids, FIFO
	reserved int      // slots held by submissions being journaled
	wake     chan struct{}
	// running are the jobs holding a concurrency slot: dispatched by this
	// process, or recovered from an earlier one (recovering of them),
	// whose containers run just the same.
	running    map[string]context.CancelFunc
	recovering int
	// bound are the containers open journal records named at start: a
	// pooled one among them carries no job label, and the reaper keeps it.
	bound    map[string]bool
	changed  chan struct{} // closed and replaced whenever a job ends
	draining bool
	// pending are the jobs whose results the journal has not taken yet.
	pending unrecorded
	// requeued are the jobs a restart queued again, each proven never run
	// here (accepted, never dispatched; or dispatched and never started):
	// on a fleet host, the fleet may have ended one meanwhile (runJob).
	requeued map[string]bool
	// fleetSilent is when the fleet last failed to answer the read of a
	// requeued job's record (zero: it answered since); a time with its
	// monotonic reading, under fleetSilentMu.
	fleetSilent   time.Time
	fleetSilentMu sync.Mutex
	uploads       uploadQuota
	pins          jobPins
	gc            gcStats
	gcMu          sync.Mutex // one collection at a time

	fleet *fleetAgent // nil unless Config.Fleet

	// tenantLocks serialize each tenant's submissions (its max_jobs).
	tenantLocks tenantLocks

	// name is the hold on the broker name (nil: the broker holds none);
	// halted, once set, is why this daemon stopped dispatching and
	// reaping while it runs (it lost its name).
	name   *broker.NameLease
	halted error

	ready atomic.Bool
	// avgJob is an exponentially weighted mean job duration in
	// nanoseconds, for Retry-After.
	avgJob atomic.Int64

	// stop ends the workers and the reaper (never a job); closing is
	// closed when Shutdown begins, to release long polls.
	stop     context.CancelFunc
	closing  chan struct{}
	workers  sync.WaitGroup // workers and reaper
	jobs     sync.WaitGroup // running and recovering jobs
	shutOnce sync.Once
}

// New returns a server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pems := [][]byte{cfg.Signer.PublicKeyPEM()}
	if cfg.Fleet != nil {
		pems = append(pems, cfg.Fleet.Keys...)
	}
	keys, err := sandbox.ParseKeySet(pems...)
	if err != nil {
		return nil, fmt.Errorf("server: own public key: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, log: log, m: newMetrics(), keys: keys,
		wake: make(chan struct{}, 1), running: map[string]context.CancelFunc{},
		changed: make(chan struct{}), closing: make(chan struct{}),
	}
	s.avgJob.Store(int64(time.Second))
	s.mux = s.routes()
	s.registerUnrecorded()
	s.registerQuota()
	s.registerGC()
	if p, ok := cfg.Broker.(interface{ PoolCounts() (int, int, int) }); ok {
		s.m.registerPool(p.PoolCounts)
	}
	return s, nil
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler { return s.logRequests(s.authorize(s.mux)) }

// Start recovers the jobs a previous process left unfinished, then starts
// the workers and the reaper. Recovery of containers that still run goes
// on in the background; the server is ready once the journal was read.
func (s *Server) Start(ctx context.Context) error {
	s.started = time.Now()
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	// Before recovery touches a container: another live daemon of this
	// name would have its own taken for leftovers.
	if h, ok := s.cfg.Broker.(NameHolder); ok {
		lease, err := h.ClaimName(ctx, "blob store "+s.cfg.Blobs.Dir())
		if err != nil {
			stop()
			return err
		}
		s.name = lease
	}
	if err := s.recover(ctx); err != nil {
		stop()
		s.releaseName()
		return err
	}
	if s.name != nil {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			s.watchName(wctx)
		}()
	}
	for range s.cfg.Concurrency {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			s.work(wctx)
		}()
	}
	s.workers.Add(1)
	go func() {
		defer s.workers.Done()
		s.reapLoop(wctx)
	}()
	s.workers.Add(1)
	go func() {
		defer s.workers.Done()
		s.gcLoop(wctx)
	}()
	if s.cfg.Fleet != nil {
		s.startFleet(wctx)
	}
	s.ready.Store(true)
	return nil
}

// watchName halts the daemon if another process takes its name: it
// stops dispatching, reaping and collecting (that process now settles the
// name's containers) and says so; jobs already running go on to their end.
func (s *Server) watchName(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-s.name.Lost():
	}
	err := fmt.Errorf("this daemon no longer holds its broker name and takes no jobs: stop it: %w", s.name.Err())
	s.log.Error("broker name lost", "error", err)
	s.mu.Lock()
	s.halted, s.draining = err, true
	s.mu.Unlock()
	s.ready.Store(false)
	s.stop()
}

// releaseName lets the next daemon of the name start at once.
func (s *Server) releaseName() {
	if s.name != nil {
		s.name.Release()
	}
}

// Shutdown stops accepting submissions and dispatching queued jobs, then
// waits for running jobs until ctx is done. It reports the jobs it left
// running; they are recovered at the next start. The broker name is
// released as it returns.
func (s *Server) Shutdown(ctx context.Context) error {
	defer s.releaseName()
	s.shutOnce.Do(func() {
		s.ready.Store(false)
		s.mu.Lock()
		s.draining = true
		s.mu.Unlock()
		close(s.closing)
		if s.stop != nil {
			s.stop()
		}
	})
	// Workers run their jobs: both are waited for under ctx, so that the
	// drain timeout holds for a job a worker is running.
	done := make(chan struct{})
	go func() {
		s.workers.Wait()
		s.jobs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return s.errPendingAtShutdown()
	case <-ctx.Done():
		s.mu.Lock()
		n := len(s.running)
		s.mu.Unlock()
		return fmt.Errorf("%d jobs still running; their containers keep their deadlines and the next start recovers them: %w", n, ctx.Err())
	}
}

// enqueue appends an accepted job and wakes a worker.
func (s *Server) enqueue(id string, reservedSlot bool) {
	s.mu.Lock()
	if reservedSlot {
		s.reserved--
	}
	s.queue = append(s.queue, id)
	s.m.queueDepth.Set(float64(len(s.queue)))
	s.mu.Unlock()
	s.signal()
}

// enqueueInOrder queues an accepted job in its acceptance order: ahead of
// every queued job accepted after it. A recovered job proven never run
// (broker.ErrNotRun) is queued again only once its recovery ended, after
// the jobs a restart requeued, and would otherwise run after jobs
// accepted long after it.
func (s *Server) enqueueInOrder(rec journal.Record) {
	s.mu.Lock()
	queued := slices.Clone(s.queue)
	s.mu.Unlock()
	later := map[string]bool{}
	for _, id := range queued {
		if q, err := s.cfg.Journal.Get(id); err == nil && journal.AcceptanceOrder(rec, q) < 0 {
			later[id] = true
		}
	}
	s.mu.Lock()
	// A job queued since the copy is a new submission: accepted after rec.
	i := slices.IndexFunc(s.queue, func(id string) bool { return later[id] || !slices.Contains(queued, id) })
	if i < 0 {
		i = len(s.queue)
	}
	s.queue = slices.Insert(s.queue, i, rec.ID)
	s.m.queueDepth.Set(float64(len(s.queue)))
	s.mu.Unlock()
	s.signal()
}

func (s *Server) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// reserve holds a queue slot for a submission; false means the queue is
// full. The caller releases it with enqueue or release.
func (s *Server) reserve() (ok, draining bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false, true
	}
	if len(s.queue)+s.reserved >= s.cfg.QueueSize+s.freeSlotsLocked() {
		return false, false
	}
	s.reserved++
	return true, false
}

// freeSlotsLocked counts idle workers: a job that can start at once does
// not wait in the queue.
func (s *Server) freeSlotsLocked() int {
	return max(0, s.cfg.Concurrency-len(s.running))
}

func (s *Server) release() {
	s.mu.Lock()
	s.reserved--
	s.mu.Unlock()
}

// retryAfter estimates when a slot frees up, in whole seconds.
func (s *Server) retryAfter() int {
	s.mu.Lock()
	waiting := len(s.queue) + s.reserved
	s.mu.Unlock()
	avg := time.Duration(s.avgJob.Load())
	secs := avg.Seconds() * float64(waiting+1) / float64(s.cfg.Concurrency)
	return int(min(60, max(1, math.Ceil(secs))))
}

// dequeue removes a queued job (cancel before it ran).
func (s *Server) dequeue(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.queue, id)
	if i < 0 {
		return false
	}
	s.queue = slices.Delete(s.queue, i, i+1)
	s.m.queueDepth.Set(float64(len(s.queue)))
	return true
}

// work runs queued jobs one at a time until ctx is done. A job is taken
// from the queue only when a slot is free: jobs recovered as running hold
// slots as dispatched ones do, so a restart never runs more than
// Concurrency jobs at once, and a job's wall time (its deadline is set
// when the broker starts it) is not spent waiting behind them.
func (s *Server) work(ctx context.Context) {
	for {
		s.mu.Lock()
		var id string
		if len(s.queue) > 0 && !s.draining && len(s.running) < s.cfg.Concurrency {
			id = s.queue[0]
			s.queue = s.queue[1:]
			s.m.queueDepth.Set(float64(len(s.queue)))
			// Registered before the lock is dropped, so that admission
			// never counts this job as both queued and not yet running.
			s.running[id] = func() {}
			s.jobs.Add(1)
		}
		s.mu.Unlock()
		if id == "" {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		s.signal() // another worker may take the next one
		s.runJob(id)
	}
}

// setRunningLocked updates the gauges of slots held, apart for jobs this
// process dispatched and jobs it recovered.
func (s *Server) setRunningLocked() {
	s.m.running.Set(float64(len(s.running) - s.recovering))
	s.m.recovering.Set(float64(s.recovering))
}

// freeSlot gives back the slot job id held (dispatched or recovered) and
// says so: to the dispatcher, and to every waiter (a fleet host's pull
// loop waits for a free slot: told only of the job's end, written just
// before, it found the slot still held and slept its whole second).
func (s *Server) freeSlot(id string) {
	s.mu.Lock()
	delete(s.running, id)
	s.setRunningLocked()
	s.mu.Unlock()
	s.signal()
	s.notifyChanged()
}

// notifyChanged wakes every waiter.
func (s *Server) notifyChanged() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *Server) changedChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Server) fault(step, id string) {
	if s.cfg.Fault != nil {
		s.cfg.Fault(step, id)
	}
}

// runJob dispatches one accepted job and records its end. The job's
// context is not derived from the server's: shutdown never cancels a job.
func (s *Server) runJob(id string) {
	defer s.jobs.Done()
	log := s.log.With("job_id", id)
	jctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	s.mu.Lock()
	s.running[id] = func() { cancel(errCancelledByAPI) }
	s.setRunningLocked()
	s.mu.Unlock()
	defer s.freeSlot(id)

	rec, err := s.cfg.Journal.Get(id)
	if err != nil {
		s.dispatchLater(log, id, fmt.Errorf("read journal: %w", err))
		return
	}
	// Taken here, whatever ends the job below: a mark left behind would
	// outlive it.
	requeued := s.takeRequeued(id)
	job, err := rec.DecodeJob()
	if err != nil {
		s.undecodable(log, rec, err)
		return
	}
	if rec.CancelRequested {
		s.finishUnrun(log, rec, job, sandbox.StatusCancelled, "cancelled before it was dispatched")
		return
	}
	if requeued {
		if cause, ended := s.endedByTheFleet(jctx, rec); ended {
			log.Info("not run: the fleet ended it while this host was away", "why", cause)
			s.finishUnrun(log, rec, job, sandbox.StatusUncertain, cause)
			return
		}
	}
	if p, ok := s.cfg.Broker.(Prechecker); ok {
		// Before the dispatch is journaled: a check that fails (or a
		// crash during it) leaves nothing of the job dispatched. A failed
		// check ends the job error, signed, rather than keeping it
		// accepted: an image whose isolation does not hold would fail
		// again at every restart, and the client must learn it.
		if err := p.Precheck(jctx, job); err != nil {
			if errors.Is(context.Cause(jctx), errCancelledByAPI) {
				s.finishUnrun(log, rec, job, sandbox.StatusCancelled, "cancelled through the API before it was dispatched")
				return
			}
			s.finishUnrun(log, rec, job, sandbox.StatusError, "refused before dispatch: "+err.Error())
			return
		}
	}
	if _, err := dispatchRecord(s.cfg.Journal, id); err != nil {
		// Not durable: not dispatched. It stays accepted and is queued
		// again (or by the next start).
		s.dispatchLater(log, id, fmt.Errorf("journal dispatch: %w", err))
		return
	}
	s.pending.dispatched(id)
	s.fault("dispatched", id)
	for _, in := range job.Inputs {
		if n, err := s.cfg.Blobs.Size(in.Digest); err == nil {
			s.m.bytesStaged.Add(float64(n))
		}
	}
	dispatched := time.Now()
	var created time.Time
	var kept string // the job's container, kept by the broker if the result is not recorded
	hooks := broker.Hooks{
		OnCreated: func(ctx context.Context, containerID string) error {
			created = time.Now()
			kept = containerID
			s.m.createLatency.Observe(created.Sub(dispatched).Seconds())
			if _, err := s.cfg.Journal.Created(id, containerID); err != nil {
				return err
			}
			log.Info("container created", "container_id", containerID)
			s.fault("created", id)
			return nil
		},
		OnStarted: func(containerID string, at time.Time) {
			s.m.startLatency.Observe(time.Since(created).Seconds())
			if _, err := s.cfg.Journal.Started(id, at); err != nil {
				log.Error("journal start", "container_id", containerID, "error", err)
			}
			s.fault("started", id)
		},
	}
	hooks.OnCollect = func(step string) { s.fault(step, id) }
	// A job a restart proved never ran (journaled: it survives another
	// restart before it runs) may meet what an earlier process's create
	// or rename left under its name.
	hooks.ReclaimName = rec.Requeued > 0
	finished, bridge := false, func() {}
	hooks.OnFinished = func(ctx context.Context, res sandbox.Result) error {
		// The result is made durable while the container still exists, so
		// a crash here is recovered from the container, not lost.
		s.fault("exited", id)
		s.observeDuration(time.Since(dispatched))
		if err := s.finishHeld(log, rec, res, &bridge); err != nil {
			return err
		}
		finished = true
		return nil
	}
	res, err := s.cfg.Broker.RunWithHooks(jctx, job, hooks)
	defer bridge()
	if finished {
		return
	}
	if err != nil && res.JobID != "" {
		// It ran, but its result is not durable: the broker kept the
		// container. The result is recorded as soon as the journal takes
		// it; if the daemon stops first, the next start recovers the job.
		s.retryRecord(log, rec, res, kept, err)
		return
	}
	if err != nil {
		// Refused before anything ran.
		status, cause := sandbox.StatusError, "refused by the broker: "+err.Error()
		switch {
		case errors.Is(err, sandbox.ErrConflict):
			status = sandbox.StatusUncertain // a container of this job exists: not ours to judge
		case errors.Is(context.Cause(jctx), errCancelledByAPI):
			status, cause = sandbox.StatusCancelled, "cancelled through the API before it ran: "+err.Error()
		}
		s.finishUnrun(log, rec, job, status, cause)
		return
	}
	// No container was created: nothing to keep for recovery.
	s.observeDuration(time.Since(dispatched))
	s.record(log, rec, res, "")
}

func (s *Server) observeDuration(d time.Duration) {
	s.m.duration.Observe(d.Seconds())
	old := s.avgJob.Load()
	s.avgJob.Store(old + (int64(d)-old)/8)
}

// finish signs a result, makes it durable, and only then reports it.
func (s *Server) finish(log *slog.Logger, rec journal.Record, res sandbox.Result) error {
	env, err := s.cfg.Signer.SignCompleted(res, rec.Receipt)
	if err != nil {
		return fmt.Errorf("sign result: %w", err)
	}
	s.m.envelopesSigned.WithLabelValues("result").Inc()
	// Its owner may read its outputs once the result says it ended (an
	// admin may read every blob).
	if err := s.cfg.Journal.GrantBlobs(rec.Tenant, resultBlobs(res)...); err != nil {
		return fmt.Errorf("grant the job's outputs to tenant %q: %w", rec.Tenant, err)
	}
	if _, err := finishRecord(s.cfg.Journal, rec.ID, res.Status, env, time.Now()); err != nil {
		return fmt.Errorf("journal result: %w", err)
	}
	s.pins.release(rec.ID) // its inputs may go now
	var collected int64
	for _, a := range res.Artifacts {
		collected += a.Size
	}
	collected += res.Stdout.Bytes + res.Stderr.Bytes
	s.m.bytesCollected.Add(float64(collected))
	s.m.jobs.WithLabelValues(string(res.Status)).Inc()
	log.Info("job ended", "status", res.Status, "exit_code", res.ExitCode, "cause", res.Cause)
	s.notifyChanged()
	return nil
}

// finishHeld is finish in a broker's OnFinished hook, while the broker
// still holds the result's outputs. If the journal refuses the result, the
// outputs are pinned before that hold ends, and *release unpins them: call
// it once retryRecord has pinned them too.
func (s *Server) finishHeld(log *slog.Logger, rec journal.Record, res sandbox.Result, release *func()) error {
	err := s.finish(log, rec, res)
	if err != nil {
		*release = s.cfg.Blobs.Pin(resultBlobs(res)...)
	}
	return err
}

// finishUnrun ends a job that no container ran (or whose container is not
// ours to judge) with a signed result saying so.
func (s *Server) finishUnrun(log *slog.Logger, rec journal.Record, job sandbox.Job, status sandbox.Status, cause string) {
	now := time.Now().UTC()
	facts, err := s.cfg.Broker.Facts(context.Background())
	if err != nil {
		log.Warn("runtime facts", "error", err)
	}
	facts.Runtime = job.Runtime
	res := sandbox.Result{
		Schema: sandbox.ResultSchema, JobID: job.ID, JobDigest: job.Digest,
		Status: status, Cause: cause, StartedAt: now, EndedAt: now, Runtime: facts,
		LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{},
	}
	s.record(log, rec, res, "")
}
