package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// FleetConfig joins the daemon to a fleet (sandbox/fleet): it takes jobs
// from the fleet's queue while it has a free slot, claims each before its
// journal accepts it, runs it as any other, and publishes its receipt,
// result and outputs to the fleet before the job's message is
// acknowledged.
type FleetConfig struct {
	Coordinator fleet.Coordinator
	// Lease is how long past its last heartbeat (and past a job's
	// deadline) this host's claims hold if it stops; another host then
	// ends them uncertain.
	Lease time.Duration
	// Heartbeat is how often this host says it is alive (default 2s, or a
	// quarter of a shorter lease).
	Heartbeat time.Duration
	// AckWait is the queue's: a held message is touched every third of it.
	AckWait time.Duration
	// Keys are the other hosts' public keys (PEM), pinned by the
	// operator: results they signed are judged here (assess) only if they
	// verify with these or this host's own key. Never learned from the
	// fleet.
	Keys [][]byte
}

func (c *FleetConfig) validate(name string) error {
	if c.Coordinator == nil {
		return errors.New("server config: Fleet.Coordinator is required")
	}
	if err := fleet.CheckHostName(name); err != nil {
		return fmt.Errorf("server config: --name: %w", err)
	}
	if c.Lease < time.Second {
		return fmt.Errorf("server config: the fleet lease %v is under 1s", c.Lease)
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = min(2*time.Second, c.Lease/4)
	}
	if c.Heartbeat*3 > c.Lease {
		return fmt.Errorf("server config: the fleet lease %v is under three heartbeats (%v)", c.Lease, c.Heartbeat)
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	return nil
}

// fleetAgent is the daemon's part in a fleet.
type fleetAgent struct {
	s   *Server
	cfg FleetConfig
	co  fleet.Coordinator
	log *slog.Logger

	mu sync.Mutex
	// following are the jobs whose outcome this host is to publish.
	following map[string]*followed
	// givingBack are the claims resume gives back (marked held, not
	// journaled); listed is closed once it has listed them. Nothing here
	// journals such a job meanwhile: an accept between the give-back's
	// look at the journal and its write would run a job the fleet has
	// queued again.
	givingBack map[string]bool
	listed     chan struct{}
	// reachedSince is when this host's heartbeats began to go through
	// without a failure since (zero: the last one failed, or none went).
	reachedSince time.Time
	// counters for /metrics
	claimed, published, expired, late, refused int
}

func (s *Server) startFleet(ctx context.Context) {
	cfg := *s.cfg.Fleet
	a := &fleetAgent{s: s, cfg: cfg, co: cfg.Coordinator, log: s.log.With("fleet_host", s.cfg.Name), following: map[string]*followed{},
		givingBack: map[string]bool{}, listed: make(chan struct{})}
	s.fleet = a
	s.m.registerFleet(a.counts)
	if ts := s.cfg.Tenants; ts != nil {
		// A tenant added by SIGHUP gets its records and blob store in the
		// fleet now: its submitters can open the fleet before its first
		// job (they may not make them).
		ts.OnReload(func() {
			go a.makeTenantStores(ctx)
		})
	}
	for _, loop := range []func(context.Context){a.heartbeatLoop, a.resume, a.pullLoop} {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			loop(ctx)
		}()
	}
}

// makeTenantStores makes (or finds) every tenant's records and blob
// store in the fleet, trying each again while the fleet does not answer.
func (a *fleetAgent) makeTenantStores(ctx context.Context) {
	for _, t := range a.s.cfg.Tenants.List() {
		for {
			c, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := a.co.Tenant(c, t.Name)
			cancel()
			if err == nil {
				break
			}
			a.log.Warn("fleet: make a tenant's stores", "tenant", t.Name, "error", err)
			if !errors.Is(err, fleet.ErrUnavailable) || !pause(ctx, time.Second) {
				break
			}
		}
	}
}

func (a *fleetAgent) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return map[string]int{"claimed": a.claimed, "published": a.published, "expired": a.expired, "late": a.late,
		"refused": a.refused, "following": len(a.following)}
}

func (a *fleetAgent) count(p *int) {
	a.mu.Lock()
	*p++
	a.mu.Unlock()
}

// took records the time one of a job's phases took here.
func (a *fleetAgent) took(phase string, d time.Duration) {
	a.s.m.fleetPhases.WithLabelValues(phase).Observe(max(d, 0).Seconds())
}

func (a *fleetAgent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	for {
		a.s.mu.Lock()
		running := len(a.s.running)
		a.s.mu.Unlock()
		h := fleet.Host{Name: a.s.cfg.Name, Version: a.s.cfg.Version, KeyID: a.s.cfg.Signer.KeyID(),
			Concurrency: a.s.cfg.Concurrency, Running: running, At: time.Now().UTC(), Lease: a.cfg.Lease}
		err := a.co.Heartbeat(ctx, h)
		a.mu.Lock()
		switch {
		case err != nil:
			a.reachedSince = time.Time{}
		case a.reachedSince.IsZero():
			a.reachedSince = h.At
		}
		a.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			a.log.Warn("fleet heartbeat", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pause waits d or until ctx is done.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// resume finishes what an earlier process of this host claimed: a job its
// journal holds is followed to its end and published; one it does not
// hold never ran here (the claim comes before the journal), so its claim
// is given back and another host may run it.
func (a *fleetAgent) resume(ctx context.Context) {
	var held []fleet.Claim
	for {
		var err error
		if held, err = a.co.Held(ctx, a.s.cfg.Name); err == nil {
			break
		}
		a.log.Warn("fleet: list the jobs this host holds", "error", err)
		if !pause(ctx, time.Second) {
			close(a.listed)
			return
		}
	}
	// Only a claim the journal provably does not hold goes back: a read
	// that fails otherwise is tried again (a journaled job given back
	// would run twice). A job of the id journaled for another tenant is
	// not the one claimed (the journal refused the claimed one).
	var back []fleet.Claim
	for _, c := range held {
		for {
			rec, err := a.s.cfg.Journal.Get(c.ID)
			if errors.Is(err, sandbox.ErrNotFound) || (err == nil && rec.Tenant != c.Tenant) {
				back = append(back, c)
			}
			if err == nil || errors.Is(err, sandbox.ErrNotFound) {
				break
			}
			a.log.Warn("fleet: read the journal for a job this host holds", "job_id", c.ID, "error", err)
			if !pause(ctx, time.Second) {
				close(a.listed)
				return
			}
		}
	}
	a.mu.Lock()
	for _, c := range back {
		a.givingBack[c.ID] = true
	}
	a.mu.Unlock()
	close(a.listed)
	for _, c := range held {
		if !slices.Contains(back, c) {
			a.follow(c.ID, nil, fleet.Record{})
		}
	}
	for _, c := range back {
		for ctx.Err() == nil {
			co, err := a.co.Tenant(ctx, c.Tenant)
			if err == nil {
				err = a.giveBack(ctx, co, c.ID)
			}
			if err == nil {
				break
			}
			a.log.Warn("fleet: give back a claim this host never journaled", "job_id", c.ID, "tenant", c.Tenant, "error", err)
			pause(ctx, time.Second)
		}
		a.mu.Lock()
		delete(a.givingBack, c.ID)
		a.mu.Unlock()
	}
}

// beingGivenBack waits until resume has listed what it gives back (or
// ctx ends) and reports whether id is among them.
func (a *fleetAgent) beingGivenBack(ctx context.Context, id string) (bool, error) {
	select {
	case <-a.listed:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.givingBack[id], nil
}

// giveBack returns this host's claim of a job it never journaled to the
// queue (co: the job's tenant's view).
func (a *fleetAgent) giveBack(ctx context.Context, co fleet.Coordinator, id string) error {
	rec, err := co.Record(ctx, id)
	if errors.Is(err, sandbox.ErrNotFound) {
		return co.Release(ctx, a.s.cfg.Name, id)
	}
	if err != nil {
		return err
	}
	if rec.State == fleet.StateClaimed && rec.Host == a.s.cfg.Name && !rec.HasReceipt() {
		rec.State, rec.Host, rec.ClaimedAt, rec.WallTime = fleet.StateQueued, "", time.Time{}, 0
		if _, err := co.Update(ctx, rec); err != nil {
			return err
		}
		a.log.Info("fleet: claim given back; the job never ran here", "job_id", id)
	}
	return co.Release(ctx, a.s.cfg.Name, id)
}

// freeSlot reports whether a job taken now would start at once.
func (a *fleetAgent) freeSlot() bool {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return !a.s.draining && len(a.s.running)+len(a.s.queue)+a.s.reserved < a.s.cfg.Concurrency
}

func (a *fleetAgent) pullLoop(ctx context.Context) {
	for ctx.Err() == nil {
		if !a.freeSlot() {
			select {
			case <-ctx.Done():
				return
			case <-a.s.changedChan():
			case <-time.After(time.Second):
			}
			continue
		}
		d, err := a.co.Next(ctx, 2*time.Second)
		if errors.Is(err, fleet.ErrNoMessage) {
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("fleet: take a job", "error", err)
				pause(ctx, time.Second)
			}
			continue
		}
		a.handle(ctx, d)
	}
}

// handle decides what one delivered job message needs.
func (a *fleetAgent) handle(ctx context.Context, d *fleet.Delivery) {
	delivered := time.Now()
	if d.Delivered == 1 && !d.Queued.IsZero() {
		a.took(phaseQueued, delivered.Sub(d.Queued))
	}
	if d.Err != nil {
		a.log.Error("fleet: a job message refused; it never runs", "error", d.Err)
		a.count(&a.refused)
		d.Refuse()
		return
	}
	job := d.Job
	log := a.log.With("job_id", job.ID)
	if d.Tenant != "" {
		log = log.With("tenant", d.Tenant)
	}
	owner, err := a.owner(d.Tenant)
	if err != nil {
		// Another host may serve it (its tenants file read before this
		// one's); nothing is lost, nothing runs here.
		log.Warn("fleet: a job this host does not take; it stays queued", "error", err)
		d.Later(30 * time.Second)
		return
	}
	ctx = asTenant(ctx, owner)
	co, err := a.co.Tenant(ctx, d.Tenant)
	if err != nil {
		log.Warn("fleet: the job's tenant", "error", err)
		d.Later(time.Second)
		return
	}
	if back, err := a.beingGivenBack(ctx, job.ID); back || err != nil {
		d.Later(time.Second)
		return
	}
	if b := d.Bound; b != nil && d.Delivered == 1 {
		// The record as its submitter made it, claimed at its revision
		// with no read first (one round trip fewer before the job runs):
		// a record changed since (another host's claim, a job ended, a
		// hint that is not so) fails the claim's compare-and-set, and the
		// record is read.
		if a.claim(ctx, co, d, job, *b, delivered, true) {
			return
		}
	}
	rec, err := co.Record(ctx, job.ID)
	if errors.Is(err, sandbox.ErrNotFound) {
		// Queued with no record (a record aged out, or a publisher that
		// did not bind): bind it as a submitter would.
		rec, err = co.Submit(ctx, job)
		if errors.Is(err, sandbox.ErrConflict) {
			log.Error("fleet: a job message whose id is bound to another digest refused; it never runs", "bound", rec.Digest, "job_digest", job.Digest)
			a.count(&a.refused)
			d.Refuse()
			return
		}
	}
	if err != nil {
		log.Warn("fleet: read the job's record", "error", err)
		d.Later(time.Second)
		return
	}
	if rec.Digest != job.Digest {
		log.Error("fleet: a job message whose id is bound to another digest refused; it never runs", "bound", rec.Digest, "job_digest", job.Digest)
		a.count(&a.refused)
		d.Refuse()
		return
	}
	switch {
	case rec.State == fleet.StateEnded:
		d.Done(ctx)
	case rec.State == fleet.StateClaimed && rec.Host == a.s.cfg.Name:
		// Ours: a message given back after this host restarted, or a
		// claim whose journal accept did not complete. It is marked held
		// (again) before the journal may take it: claim writes the mark
		// and the claim together, and the claim may have landed alone.
		if err := co.Hold(ctx, a.s.cfg.Name, job.ID); err != nil {
			log.Warn("fleet: mark the claim", "error", err)
			d.Later(time.Second)
			return
		}
		a.run(ctx, co, d, job, rec)
	case rec.State == fleet.StateClaimed:
		a.checkLease(ctx, co, d, job, rec)
	default:
		a.claim(ctx, co, d, job, rec, delivered, false)
	}
}

// owner is the tenant a job queued on tenant's subject is run for: with
// a tenants file, a tenant it names (as a submitter: only the tenant's
// users may queue on its subject); without one, the fleet without tenants.
func (a *fleetAgent) owner(tenant string) (*caller, error) {
	ts := a.s.cfg.Tenants
	switch {
	case ts == nil && tenant == "":
		return nil, nil
	case ts == nil:
		return nil, fmt.Errorf("queued for tenant %q, and this host has no tenants file (--tenants)", tenant)
	case tenant == "":
		return nil, fmt.Errorf("queued for no tenant, and this host serves the tenants of %s only", ts.File())
	}
	c, ok := ts.ByName(tenant)
	if !ok {
		return nil, fmt.Errorf("queued for tenant %q, which %s does not name", tenant, ts.File())
	}
	return &c, nil
}

// claim takes a queued job: its inputs are fetched first (a host that
// cannot get them does not hold the job), then the claim is set by
// compare-and-set, with the held mark written at the same time. A claim
// whose write timed out may have been made: the message goes back, and
// its next delivery reads the record again.
//
// hinted is a claim of the record its message says its submitter made
// (Delivery.Bound), not of one read: if that record has changed, claim
// returns false with nothing done (its mark removed), for the record to be
// read. Otherwise it returns true: the message is handled.
func (a *fleetAgent) claim(ctx context.Context, co fleet.Coordinator, d *fleet.Delivery, job sandbox.Job, rec fleet.Record, delivered time.Time, hinted bool) bool {
	log := a.log.With("job_id", job.ID)
	missing, fetchErr := a.fetchInputs(ctx, co, job)
	if fetchErr != nil && missing == "" {
		log.Warn("fleet: fetch the job's inputs", "error", fetchErr)
		d.Later(time.Second)
		return true
	}
	rec.State, rec.Host, rec.ClaimedAt, rec.WallTime = fleet.StateClaimed, a.s.cfg.Name, time.Now().UTC(), job.Limits.WallTime()
	// The held mark and the claim are written at once (one synced write's
	// wait, not two); the journal takes the job only once both are
	// durable. A crash between the two leaves one of them:
	//   - the mark alone: the restart gives back each marked job its
	//     journal does not hold; this one is not claimed, so only the mark
	//     goes (as when the mark came first);
	//   - the claim alone: the job's message, not acknowledged, comes
	//     back; on this host the claim is "ours" and marked before it
	//     runs (handle), on another it waits for this host's lease, as
	//     any claim does. It runs at most once, here, and is not lost.
	var held error
	var marking sync.WaitGroup
	marking.Go(func() { held = co.Hold(ctx, a.s.cfg.Name, job.ID) })
	claimed, err := co.Update(ctx, rec)
	marking.Wait()
	if err != nil {
		if errors.Is(err, fleet.ErrRevision) {
			a.releaseUnlessOurs(ctx, co, job.ID)
			if hinted {
				return false
			}
		}
		log.Info("fleet: claim not made (another host's, or to be read again)", "error", err)
		d.Later(0)
		return true
	}
	if held != nil {
		// Claimed, not marked: nothing journaled. The message comes back,
		// and its next delivery marks the claim before it runs.
		log.Warn("fleet: mark the claim", "error", held)
		d.Later(time.Second)
		return true
	}
	a.count(&a.claimed)
	a.took(phaseClaim, time.Since(delivered))
	log.Info("fleet: job claimed", "revision", claimed.Revision)
	if missing != "" {
		a.endUnrun(ctx, co, d, job, claimed, sandbox.StatusError, fmt.Sprintf("refused by host %s: input %s is not in the fleet's blob store: %v", a.s.cfg.Name, missing, fetchErr))
		return true
	}
	a.run(ctx, co, d, job, claimed)
	return true
}

// releaseUnlessOurs removes this host's held mark of a job whose claim
// failed here, unless the record, read now, holds this host's claim: one
// made by another way (another message of the job, a submit on this
// host's socket) keeps the mark its run needs.
func (a *fleetAgent) releaseUnlessOurs(ctx context.Context, co fleet.Coordinator, id string) {
	if rec, err := co.Record(ctx, id); err == nil && rec.State == fleet.StateClaimed && rec.Host == a.s.cfg.Name {
		return
	}
	co.Release(ctx, a.s.cfg.Name, id)
}

// fetchInputs copies the job's inputs from the fleet's blob store (its
// tenant's, co) into this host's (fetch). missing names an input the
// fleet does not have (the job cannot run anywhere).
func (a *fleetAgent) fetchInputs(ctx context.Context, co fleet.Coordinator, job sandbox.Job) (missing string, err error) {
	for _, in := range job.Inputs {
		if err := a.fetch(ctx, co, in.Digest); err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				return in.Digest, err
			}
			return "", fmt.Errorf("input %s: %w", in.Digest, err)
		}
	}
	return "", nil
}

// fetch copies blob d from the fleet's blob store (co: the tenant's)
// into this host's, checked against its digest. With tenants, a blob is
// the tenant's only if its own store in the fleet holds it, even when
// this host holds the bytes already (another tenant's upload): it is
// then granted to the tenant here, as its upload would be. A blob the
// fleet does not hold wraps sandbox.ErrNotFound.
func (a *fleetAgent) fetch(ctx context.Context, co fleet.Coordinator, d string) error {
	tenant := tenantOf(ctx)
	if tenant == nil && a.s.cfg.Blobs.Has(d) {
		return nil
	}
	if tenant != nil {
		if mine, err := a.s.cfg.Journal.BlobGranted(tenant.Name, d); err != nil {
			return err
		} else if mine && a.s.cfg.Blobs.Has(d) {
			return nil
		}
	}
	rc, err := co.Blob(ctx, d)
	if err != nil {
		return err
	}
	_, _, err = a.s.cfg.Blobs.Put(rc, d, a.s.cfg.MaxBlobBytes)
	rc.Close()
	if err != nil {
		return err
	}
	a.s.cfg.Blobs.Lease(d)
	if tenant != nil {
		return a.s.cfg.Journal.GrantBlobs(tenant.Name, d)
	}
	return nil
}

// run admits a job this host has claimed to its own journal and queue,
// puts the receipt in the record, and follows the job to its end.
func (a *fleetAgent) run(ctx context.Context, co fleet.Coordinator, d *fleet.Delivery, job sandbox.Job, rec fleet.Record) {
	log := a.log.With("job_id", job.ID)
	if missing, err := a.fetchInputs(ctx, co, job); err != nil {
		if missing != "" {
			a.endUnrun(ctx, co, d, job, rec, sandbox.StatusError, fmt.Sprintf("refused by host %s: input %s is not in the fleet's blob store", a.s.cfg.Name, missing))
			return
		}
		log.Warn("fleet: fetch the job's inputs", "error", err)
		d.Later(time.Second)
		return
	}
	jrec, _, ref := a.s.admitAs(ctx, job, func() (journal.Record, bool, *refusal) { return a.s.admit(ctx, job, nil) })
	if ref != nil {
		quota := errors.Is(ref.err, errTenantQuota) && ref.code != http.StatusTooManyRequests
		if !quota && (ref.code == http.StatusTooManyRequests || ref.code == http.StatusServiceUnavailable || ref.code >= 500) {
			// Not now, not never: the claim stays, the message comes back.
			log.Warn("fleet: the journal did not take a claimed job; later", "error", ref.err)
			d.Later(time.Second)
			return
		}
		a.endUnrun(ctx, co, d, job, rec, sandbox.StatusError, fmt.Sprintf("refused by host %s: %v", a.s.cfg.Name, ref.err))
		return
	}
	if !rec.HasReceipt() {
		began := time.Now()
		if rec = a.publishReceipt(ctx, co, log, job.ID, jrec.Receipt, rec); rec.HasReceipt() {
			a.took(phaseReceipt, time.Since(began))
		}
	}
	a.follow(job.ID, d, rec)
}

// publishReceipt puts the receipt of a job this host claimed in its
// record, starting from claimed (this host's claim as it wrote or read
// it: written at its revision, no read first), and returns the record as
// written (or claimed, if it was not). A failure is logged: the result,
// published later, carries the receipt too.
func (a *fleetAgent) publishReceipt(ctx context.Context, co fleet.Coordinator, log *slog.Logger, id string, receipt []byte, claimed fleet.Record) fleet.Record {
	var held fleet.Record // the envelope, inline or by digest
	err := fleet.SetReceipt(ctx, co, &held, receipt)
	written := claimed
	if err == nil {
		written, _, err = a.updateFrom(ctx, co, id, claimed, func(r *fleet.Record) bool {
			if r.State != fleet.StateClaimed || r.Host != a.s.cfg.Name || r.HasReceipt() {
				return false
			}
			r.Receipt, r.ReceiptBlob = held.Receipt, held.ReceiptBlob
			return true
		})
	}
	if err != nil {
		log.Warn("fleet: publish the receipt", "error", err)
		return claimed
	}
	return written
}

// admitSubmitted admits a job submitted to this host's own API. The fleet
// runs each job id at most once, so it is claimed fleet-wide first, for
// this host, before the journal accepts it (after the checks that may
// refuse it, which journal nothing): a job the fleet has bound already is
// this host's only if it holds the claim (or takes a queued one by
// compare-and-set, as from the queue); otherwise the fleet's receipt is
// the answer, and nothing runs here.
func (a *fleetAgent) admitSubmitted(ctx context.Context, job sandbox.Job) (journal.Record, bool, *refusal) {
	if _, err := a.s.cfg.Journal.Get(job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		return a.s.admit(ctx, job, nil) // journaled here (or the journal failed): as any host
	}
	host := a.s.cfg.Name
	log := a.log.With("job_id", job.ID)
	unavailable := func(err error) *refusal {
		return &refusal{code: http.StatusServiceUnavailable, reason: "fleet_unavailable", retryAfter: 1,
			err: fmt.Errorf("job %s: the fleet did not answer; it may be claimed here: submit it again: %w", job.ID, err)}
	}
	co, err := a.co.Tenant(ctx, tenantName(ctx))
	if err != nil {
		return journal.Record{}, false, unavailable(err)
	}
	// A restart still listing its claims (the fleet not answering) is
	// said so soon, as a claim that cannot be made would be.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	back, err := a.beingGivenBack(lctx, job.ID)
	cancel()
	if err != nil {
		return journal.Record{}, false, unavailable(fmt.Errorf("this host is still listing the claims it held before it started: %w", err))
	} else if back {
		return journal.Record{}, false, unavailable(errors.New("this host's claim of it, from before a restart, is being given back"))
	}
	claimed := false // this call may hold the claim: what a refusal after it gives back
	// ours is the claim as written (or read), once it is this host's.
	var ours fleet.Record
	claim := func(ctx context.Context) error {
		// Marked held first: a restart finishes, or gives back, what it
		// holds; a claim that timed out may have been made. Not both at
		// once, as from the queue (claim): a job submitted here has no
		// message in the queue, so a claim that landed without its mark
		// would be found by nothing, and the job would stay claimed and
		// never run.
		if err := co.Hold(ctx, host, job.ID); err != nil {
			return err
		}
		claimed = true
		rec, made, err := co.Claim(ctx, job, host)
		if err == nil && !made && rec.State == fleet.StateQueued {
			rec.State, rec.Host, rec.ClaimedAt, rec.WallTime = fleet.StateClaimed, host, time.Now().UTC(), job.Limits.WallTime()
			var written fleet.Record
			if written, err = co.Update(ctx, rec); err == nil {
				rec = written
			} else if errors.Is(err, fleet.ErrRevision) {
				rec, err = co.Record(ctx, job.ID)
			}
		}
		ours = rec
		if err == nil && !(rec.State == fleet.StateClaimed && rec.Host == host) {
			claimed = false
			co.Release(ctx, host, job.ID)
			return &elsewhere{rec}
		}
		if errors.Is(err, sandbox.ErrConflict) {
			claimed = false
			co.Release(ctx, host, job.ID)
		}
		return err
	}
	jrec, existing, ref := a.s.admit(ctx, job, claim)
	var other *elsewhere
	switch {
	case ref == nil:
		if !existing {
			a.count(&a.claimed)
			log.Info("fleet: job submitted here claimed")
			a.follow(job.ID, nil, a.publishReceipt(ctx, co, log, job.ID, jrec.Receipt, ours))
		}
		return jrec, existing, nil
	case errors.As(ref.err, &other):
		fr, err := a.fleetRecord(ctx, job.ID)
		if err != nil {
			return journal.Record{}, false, unavailable(err)
		}
		if fr.Receipt == nil {
			return journal.Record{}, false, &refusal{code: http.StatusServiceUnavailable, reason: "fleet_elsewhere", retryAfter: 1,
				err: fmt.Errorf("job %s is the fleet's (%s), and no host has accepted it yet: submit it again for its receipt", job.ID, other)}
		}
		return fr, true, nil
	case errors.Is(ref.err, fleet.ErrUnavailable):
		return journal.Record{}, false, unavailable(ref.err)
	case claimed && ref.code/100 != 5:
		// Refused here after it was claimed (the journal refused it):
		// nothing ran, so the claim goes back. A refusal before the
		// claim (a check, the queue full) touched nothing in the fleet.
		if err := a.giveBack(ctx, co, job.ID); err != nil {
			log.Warn("fleet: give back a claim the journal did not take", "error", err)
		}
	}
	return journal.Record{}, false, ref
}

// wait waits up to timeout for the fleet's record of a job another host
// holds to end, and returns it as fleetRecord does (not ended yet: as it
// is then).
func (a *fleetAgent) wait(ctx context.Context, id string, timeout time.Duration) (journal.Record, error) {
	co, err := a.co.Tenant(ctx, tenantName(ctx))
	if err != nil {
		return journal.Record{}, err
	}
	if _, err := co.Record(ctx, id); errors.Is(err, sandbox.ErrNotFound) {
		return journal.Record{}, err
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err = co.Watch(c, id, func(r fleet.Record) bool { return r.State == fleet.StateEnded })
	if err != nil && ctx.Err() != nil {
		return journal.Record{}, ctx.Err()
	}
	if errors.Is(err, sandbox.ErrNotFound) {
		return journal.Record{}, err
	}
	return a.fleetRecord(ctx, id)
}

// elsewhere is a job the fleet has bound to another host, or queued.
type elsewhere struct{ rec fleet.Record }

func (e *elsewhere) Error() string {
	if e.rec.Host == "" {
		return "queued in the fleet"
	}
	return fmt.Sprintf("%s by host %s", e.rec.State, e.rec.Host)
}

// update applies change to the job's current record and writes it by
// compare-and-set, reading again after a lost race, until it is written,
// change declines (false, nil), or ctx ends. A write that timed out is
// read back before it is tried again. It returns the record as written,
// or as last read.
func (a *fleetAgent) update(ctx context.Context, co fleet.Coordinator, id string, change func(*fleet.Record) bool) (fleet.Record, bool, error) {
	for {
		rec, err := co.Record(ctx, id)
		if errors.Is(err, sandbox.ErrNotFound) {
			return fleet.Record{}, false, err // gone: the caller decides
		}
		if err == nil {
			if !change(&rec) {
				return rec, false, nil
			}
			var written fleet.Record
			if written, err = co.Update(ctx, rec); err == nil {
				return written, true, nil
			}
		}
		if ctx.Err() != nil {
			return fleet.Record{}, false, err
		}
		if !errors.Is(err, fleet.ErrRevision) {
			a.log.Warn("fleet: update a job's record; trying again", "job_id", id, "error", err)
			if !pause(ctx, 500*time.Millisecond) {
				return fleet.Record{}, false, err
			}
		}
	}
}

// updateFrom is update starting from known, the job's record as this
// host last wrote or read it (zero if it has none): change is written at
// known's revision without a read first, and only a record that moved
// since (or a write that did not answer, which may have been made) is
// read again. A write at a revision is as safe as a read and a write: it
// lands only on exactly the record change looked at.
func (a *fleetAgent) updateFrom(ctx context.Context, co fleet.Coordinator, id string, known fleet.Record, change func(*fleet.Record) bool) (fleet.Record, bool, error) {
	if rec := known; rec.ID == id && rec.Revision != 0 && change(&rec) {
		if written, err := co.Update(ctx, rec); err == nil {
			return written, true, nil
		}
	}
	return a.update(ctx, co, id, change)
}

// followed is a job whose outcome this host is to publish: the message
// of it if this process holds one, and its record as this host last
// wrote it (zero if unknown), where its result is written first.
type followed struct {
	d   *fleet.Delivery
	rec fleet.Record
}

// follow publishes the job's outcome once its journal has it. A second
// call for a job already followed hands over the message.
func (a *fleetAgent) follow(id string, d *fleet.Delivery, rec fleet.Record) {
	a.mu.Lock()
	if f, ok := a.following[id]; ok {
		var again, older *fleet.Delivery
		switch {
		case d == nil:
		case f.d != nil && d.Seq != 0 && f.d.Seq != 0 && d.Seq != f.d.Seq:
			// Another message of the job (queued again): the one held
			// stands for the job until its result is out, and this one
			// is acknowledged. Given back, each would bring the other
			// back, at once, for as long as the job runs.
			again = d
		default:
			older, f.d = f.d, d // an older delivery of the same message
		}
		if rec.Revision > f.rec.Revision {
			f.rec = rec
		}
		a.mu.Unlock()
		if older != nil {
			older.Later(0)
		}
		if again != nil {
			again.Done(context.Background())
		}
		return
	}
	a.following[id] = &followed{d: d, rec: rec}
	a.mu.Unlock()
	a.s.jobs.Add(1)
	go func() {
		defer a.s.jobs.Done()
		a.publishWhenDone(id)
	}()
}

func (a *fleetAgent) followedAs(id string) followed {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f := a.following[id]; f != nil {
		return *f
	}
	return followed{}
}

func (a *fleetAgent) publishWhenDone(id string) {
	log := a.log.With("job_id", id)
	ctx := context.Background()
	touch := time.NewTicker(max(time.Second, a.cfg.AckWait/3))
	defer touch.Stop()
	var rec journal.Record
	for {
		changed := a.s.changedChan()
		var err error
		rec, err = a.s.cfg.Journal.Get(id)
		if err == nil && rec.State.Terminal() {
			break
		}
		select {
		case <-changed:
		case <-touch.C:
			if d := a.followedAs(id).d; d != nil {
				d.Working()
			}
		case <-a.s.closing:
			// Shut down: the next start resumes it from the held mark.
			if d := a.followedAs(id).d; d != nil {
				d.Later(0)
			}
			a.mu.Lock()
			delete(a.following, id)
			a.mu.Unlock()
			return
		}
	}
	began := time.Now()
	for {
		err := a.publish(ctx, log, rec, a.followedAs(id).rec)
		if err == nil {
			a.took(phasePublish, time.Since(began))
			break
		}
		log.Warn("fleet: publish the result; trying again", "error", err)
		select {
		case <-time.After(time.Second):
		case <-a.s.closing:
			a.mu.Lock()
			delete(a.following, id)
			a.mu.Unlock()
			return
		}
	}
	d := a.followedAs(id).d
	a.mu.Lock()
	delete(a.following, id)
	a.mu.Unlock()
	// The outcome is durable in the record: the message is acknowledged
	// and the held mark removed at once, as neither needs the other. A
	// crash before the acknowledgement brings the message back, and its
	// delivery finds the job ended (handle); one before the mark's
	// removal leaves a mark whose job the journal holds, and the restart
	// publishes it again (the record, ended by this host, is kept as it
	// is) and removes the mark.
	var acked sync.WaitGroup
	if d != nil {
		acked.Go(func() { d.Done(ctx) })
	}
	release := func() error {
		co, err := a.co.Tenant(ctx, rec.Tenant)
		if err != nil {
			return err
		}
		return co.Release(ctx, a.s.cfg.Name, id)
	}
	for err := release(); err != nil; err = release() {
		log.Warn("fleet: remove the held mark; trying again", "error", err)
		if !pauseUnless(a.s.closing, time.Second) {
			break // the next start removes it
		}
	}
	acked.Wait()
}

// pauseUnless waits d or until stop is closed.
func pauseUnless(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

// publish puts an ended job's outputs in the fleet's blob store, then its
// result in the record, by compare-and-set on this host's claim (from
// known, the record as this host last wrote it, if it has it): a record
// another host already ended (it saw this host's lease expire) is not
// overwritten, and the late result is logged.
func (a *fleetAgent) publish(ctx context.Context, log *slog.Logger, rec journal.Record, known fleet.Record) error {
	job, err := rec.DecodeJob()
	if err != nil {
		return err
	}
	co, err := a.co.Tenant(ctx, rec.Tenant)
	if err != nil {
		return err
	}
	res, err := sandbox.VerifyResult(a.s.keys, rec.Result, job, rec.Receipt)
	if err != nil {
		return fmt.Errorf("own result: %w", err)
	}
	// Its outputs, and its inputs (a job submitted to this host came
	// with them here only): any host may judge it.
	digests := resultBlobs(res)
	for _, in := range job.Inputs {
		digests = append(digests, in.Digest)
	}
	// Every blob the record is to name is stored before the record names
	// it, all at once: each is its own content-addressed object, so their
	// order does not matter, and a crash among them leaves only blobs no
	// record names yet (the next publish finds them there). The envelopes
	// go with them (each is a blob only if too large for the record).
	var withReceipt, withResult fleet.Record // the envelopes, inline or by digest
	puts := []func() error{
		func() error { return fleet.SetReceipt(ctx, co, &withReceipt, rec.Receipt) },
		func() error { return fleet.SetResult(ctx, co, &withResult, rec.Result) },
	}
	seen := map[string]bool{fleet.EmptyDigest: true} // never stored: every reader has it
	for _, d := range digests {
		if !seen[d] {
			seen[d] = true
			puts = append(puts, func() error { return a.putBlob(ctx, co, d) })
		}
	}
	if err := all(puts, 8); err != nil {
		return err
	}
	// taken: the record holds this host's result (written now, or by an
	// earlier publish); otherwise it says whose word it holds instead.
	var taken bool
	var holder string
	end := func(r *fleet.Record) bool {
		switch {
		case r.State == fleet.StateEnded:
			taken, holder = r.EndedBy == a.s.cfg.Name, "ended by "+r.EndedBy
			return false
		case r.Host != a.s.cfg.Name || r.Digest != rec.Digest:
			taken, holder = false, fmt.Sprintf("%s by host %q, digest %s", r.State, r.Host, r.Digest)
			return false
		}
		taken = true
		r.Receipt, r.ReceiptBlob, r.Result, r.ResultBlob = withReceipt.Receipt, withReceipt.ReceiptBlob, withResult.Result, withResult.ResultBlob
		r.State, r.EndedBy, r.Status = fleet.StateEnded, a.s.cfg.Name, res.Status
		return true
	}
	_, _, err = a.updateFrom(ctx, co, rec.ID, known, end)
	if errors.Is(err, sandbox.ErrNotFound) {
		// The record is gone while this host ran the job (a writer of the
		// records deleted or rolled it up). It is bound again as this
		// host's claim and ended at once: the job's message, not yet
		// acknowledged, would otherwise find no record and be run again
		// elsewhere; and publishing must not wait for a record that will
		// never come back.
		log.Warn("fleet: the job's record is gone from the fleet; bound again as this host's claim and ended with its result")
		if _, _, err := co.Claim(ctx, job, a.s.cfg.Name); err != nil {
			return err
		}
		_, _, err = a.update(ctx, co, rec.ID, end)
	}
	if err != nil {
		return err
	}
	if !taken {
		a.count(&a.late)
		log.Warn("fleet: late result not taken: the fleet's record is another's word", "status", res.Status, "record", holder)
	} else {
		a.count(&a.published)
		log.Info("fleet: result published", "status", res.Status)
	}
	return nil
}

// all runs fns, at most n at once, and returns their errors joined.
func all(fns []func() error, n int) error {
	errs := make([]error, len(fns))
	slots := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, fn := range fns {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[i] = fn()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (a *fleetAgent) putBlob(ctx context.Context, co fleet.Coordinator, digest string) error {
	f, err := a.s.cfg.Blobs.Open(digest)
	if err != nil {
		return fmt.Errorf("output %s: %w", digest, err)
	}
	defer f.Close()
	return co.PutBlob(ctx, digest, f.Size(), f)
}

// checkLease looks at a job another host claimed: while that host's lease
// holds the message comes back later; once it lapsed, the job is ended
// uncertain here (never run again), signed by this host.
func (a *fleetAgent) checkLease(ctx context.Context, co fleet.Coordinator, d *fleet.Delivery, job sandbox.Job, rec fleet.Record) {
	hosts, err := a.co.Hosts(ctx)
	if err != nil {
		d.Later(time.Second)
		return
	}
	expiry := rec.ClaimedAt.Add(rec.WallTime).Add(a.cfg.Lease) // a host never seen
	for _, h := range hosts {
		if h.Name == rec.Host {
			expiry = fleet.Expiry(rec, h)
		}
	}
	// A host that could not reach the fleet itself cannot tell another
	// host's silence from the same outage (a quorum lost, a node stopped):
	// no lease lapses before this host's own heartbeats have gone through
	// for a whole lease, time in which the other's would have too. A
	// quorum loss longer than a lease ended every job held uncertain.
	a.mu.Lock()
	since := a.reachedSince
	a.mu.Unlock()
	if since.IsZero() {
		d.Later(time.Second)
		return
	}
	if own := since.Add(a.cfg.Lease); own.After(expiry) {
		expiry = own
	}
	if wait := time.Until(expiry); wait > 0 {
		d.Later(min(max(wait, time.Second), 30*time.Second))
		return
	}
	a.count(&a.expired)
	a.endUnrun(ctx, co, d, job, rec, sandbox.StatusUncertain, fmt.Sprintf("host %s claimed it at %s and sent no word within its lease (until %s); it is not run again",
		rec.Host, rec.ClaimedAt.Format(time.RFC3339), expiry.UTC().Format(time.RFC3339)))
}

// endUnrun ends a job this host did not run, with a result it signs (and
// a receipt, if the record has none): a claimed job its journal refused,
// or another host's whose lease lapsed.
func (a *fleetAgent) endUnrun(ctx context.Context, co fleet.Coordinator, d *fleet.Delivery, job sandbox.Job, rec fleet.Record, status sandbox.Status, cause string) {
	log := a.log.With("job_id", job.ID)
	facts, err := a.s.cfg.Broker.Facts(ctx)
	if err != nil {
		log.Warn("runtime facts", "error", err)
	}
	facts.Runtime = job.Runtime
	now := time.Now().UTC()
	receiptEnv, _, err := fleet.Envelopes(ctx, co, rec)
	if err != nil {
		log.Warn("fleet: read the record's receipt", "error", err)
		d.Later(time.Second)
		return
	}
	if len(receiptEnv) == 0 {
		if receiptEnv, err = a.s.cfg.Signer.SignAccepted(job, facts, now); err != nil {
			log.Error("fleet: sign a receipt", "error", err)
			d.Later(time.Second)
			return
		}
	}
	res := sandbox.Result{
		Schema: sandbox.ResultSchema, JobID: job.ID, JobDigest: job.Digest,
		Status: status, Cause: cause, StartedAt: now, EndedAt: now, Runtime: facts,
		LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{},
	}
	env, err := a.s.cfg.Signer.SignCompleted(res, receiptEnv)
	if err != nil {
		log.Error("fleet: sign a result", "error", err)
		d.Later(time.Second)
		return
	}
	holder := rec.Host
	if err := fleet.SetReceipt(ctx, co, &rec, receiptEnv); err != nil {
		log.Warn("fleet: store the receipt", "error", err)
		d.Later(time.Second)
		return
	}
	if err := fleet.SetResult(ctx, co, &rec, env); err != nil {
		log.Warn("fleet: store the result", "error", err)
		d.Later(time.Second)
		return
	}
	rec.State, rec.EndedBy, rec.Status = fleet.StateEnded, a.s.cfg.Name, status
	if _, err := co.Update(ctx, rec); err != nil {
		log.Info("fleet: end the job: the record changed or did not answer; read again", "error", err)
		d.Later(0)
		return
	}
	log.Warn("fleet: job ended without running here", "status", status, "cause", cause)
	if holder == a.s.cfg.Name {
		co.Release(ctx, holder, job.ID)
	}
	// Another holder's mark stays: if it returns, it finds the job ended,
	// and logs its late result (records age out with the bucket).
	d.Done(ctx)
}

// jobRecord reads a job for the assess endpoint: from this host's
// journal, or, on a fleet host, from the fleet's record of a job another
// host ran (its job out of its receipt, verified against the pinned keys,
// its outputs copied from the fleet's blob store by digest).
func (s *Server) jobRecord(ctx context.Context, id string) (journal.Record, error) {
	rec, err := s.cfg.Journal.Get(id)
	if err == nil || s.fleet == nil || !errors.Is(err, sandbox.ErrNotFound) {
		return rec, err
	}
	return s.fleet.fleetRecord(ctx, id)
}

// fleetRecord is the fleet's record of a job as this host's journal would
// hold it: its receipt (and the job out of it) once a host accepted it,
// its result once it ended, each verified against the pinned keys; the
// outputs of an ended job are copied from the fleet's blob store.
func (a *fleetAgent) fleetRecord(ctx context.Context, id string) (journal.Record, error) {
	tenant := tenantName(ctx)
	co, err := a.co.Tenant(ctx, tenant)
	if err != nil {
		return journal.Record{}, err
	}
	fr, err := co.Record(ctx, id)
	if err != nil {
		return journal.Record{}, err
	}
	if !fr.HasReceipt() {
		return journal.Record{ID: id, Digest: fr.Digest, State: sandbox.JobAccepted, Tenant: tenant}, nil
	}
	receiptEnv, resultEnv, err := fleet.Envelopes(ctx, co, fr)
	if err != nil {
		return journal.Record{}, err
	}
	att, err := sandbox.VerifyAttestation(a.s.keys, receiptEnv)
	if err != nil || att.Receipt == nil {
		return journal.Record{}, fmt.Errorf("job %s: the fleet's receipt: %w", id, err)
	}
	job := att.Receipt.Job
	if job.ID != id || job.Digest != fr.Digest {
		return journal.Record{}, fmt.Errorf("job %s: the fleet's receipt is for job %s (%s), the record binds %s", id, job.ID, job.Digest, fr.Digest)
	}
	if fr.State != fleet.StateEnded {
		canon, err := job.CanonicalJSON()
		if err != nil {
			return journal.Record{}, err
		}
		return journal.Record{ID: id, Digest: job.Digest, Job: canon, State: sandbox.JobAccepted, Receipt: receiptEnv, Tenant: tenant}, nil
	}
	res, err := sandbox.VerifyResult(a.s.keys, resultEnv, job, receiptEnv)
	if err != nil {
		return journal.Record{}, fmt.Errorf("job %s: the fleet's result: %w", id, err)
	}
	// What it was given and what it gave: the judge reads both.
	digests := resultBlobs(res)
	for _, in := range job.Inputs {
		digests = append(digests, in.Digest)
	}
	for _, d := range digests {
		if err := a.fetch(ctx, co, d); err != nil {
			return journal.Record{}, fmt.Errorf("job %s: output %s: %w", id, d, err)
		}
	}
	canon, err := job.CanonicalJSON()
	if err != nil {
		return journal.Record{}, err
	}
	state := sandbox.JobFinished
	if res.Status == sandbox.StatusUncertain {
		state = sandbox.JobUncertain
	}
	return journal.Record{ID: id, Digest: job.Digest, Job: canon, State: state, Receipt: receiptEnv, Result: resultEnv, Status: res.Status, Tenant: tenant}, nil
}
