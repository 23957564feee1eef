package server

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// count is how many of calls begin with prefix.
func count(calls []string, prefix string) int {
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// A no-op job from the queue costs its host no read (its message names
// the record its submit made, claimed at that revision) and five writes:
// the held mark and the claim (at once), the receipt and the result (each
// at the revision the host wrote last, no read first), the mark's removal;
// then the acknowledgement. Its empty logs are not stored. Before: three
// reads, and two blob store round trips for the empty logs; then one
// read, the record's before the claim.
func TestFleetNoopJobRoundTrips(t *testing.T) {
	ff := newFakeFleet()
	h := fleetHost(t, ff, "h1", &[2]string{"", ""})
	job := newJob(t, "noop-1", "true")
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })

	calls := ff.callsAbout(job.ID)
	for _, c := range []struct {
		prefix string
		want   int
	}{
		{"Record ", 0}, {"Hold ", 1}, {"Update " + job.ID + " claimed", 2}, {"Update " + job.ID + " ended", 1},
		{"Release ", 1}, {"Ack ", 1}, {"Later ", 0}, {"PutBlob ", 0},
	} {
		if got := count(calls, c.prefix); got != c.want {
			t.Errorf("%q calls: got %d, want %d (calls %q)", c.prefix, got, c.want, calls)
		}
	}
	r := fleet.NewRunner(ff, h.keys)
	sr, err := r.Result(context.Background(), job)
	if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("the fleet's result: %s, %v", sr.Result.Status, err)
	}
	for _, l := range []sandbox.Log{sr.Result.Stdout, sr.Result.Stderr} {
		if l.Digest != fleet.EmptyDigest {
			t.Errorf("a log of the no-op job: digest %s, want the empty one", l.Digest)
		}
	}
}

// A host claiming a job from the queue writes its held mark and its claim
// at once, not one after the other.
func TestFleetClaimWritesTheMarkAndTheClaimAtOnce(t *testing.T) {
	ff := newFakeFleet()
	job := newJob(t, "at-once-1", "true")
	m := newMeeting("held mark", "claim")
	ff.onHold = func(_, id string) error {
		if id != job.ID {
			return nil
		}
		return m.meet("held mark", "claim")
	}
	ff.onUpdate = func(rec fleet.Record) error {
		if rec.ID != job.ID || rec.State != fleet.StateClaimed || rec.HasReceipt() {
			return nil
		}
		return m.meet("claim", "held mark")
	}
	fleetHost(t, ff, "h1", nil)
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	if alone := m.wentAlone(); len(alone) > 0 {
		t.Errorf("%v written alone: want the held mark and the claim under way together (calls %q)", alone, ff.callsAbout(job.ID))
	}
}

// A host crashed between its held mark and its claim, written at once,
// left either, neither or both; started again, it runs the job once,
// under its own claim, and ends it. A claim that landed without its mark
// is marked again before the journal takes the job. Its message may reach
// another host first: that one only waits for the claimant's lease.
func TestFleetCrashBetweenTheMarkAndTheClaim(t *testing.T) {
	tests := []struct {
		name           string
		mark, claim    bool
		otherHostFirst bool
	}{
		{name: "neither"},
		{name: "the mark alone", mark: true},
		{name: "the claim alone", claim: true},
		{name: "the claim alone, its message to another host first", claim: true, otherHostFirst: true},
		{name: "both", mark: true, claim: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ff := newFakeFleet()
			job := newJob(t, "crash-1", "true")
			rec := fleet.Record{ID: job.ID, Digest: job.Digest, State: fleet.StateQueued, SubmittedAt: time.Now().UTC()}
			if tt.claim {
				rec.State, rec.Host, rec.ClaimedAt, rec.WallTime = fleet.StateClaimed, "h1", time.Now().UTC(), job.Limits.WallTime()
			}
			ff.put(rec)
			if tt.mark {
				ff.Hold(context.Background(), "h1", job.ID)
			}
			ff.queue(t, job) // not acknowledged: it comes back
			var other *fixture
			if tt.otherHostFirst {
				// h1 beat just before it stopped: its lease holds.
				ff.Heartbeat(context.Background(), fleet.Host{Name: "h1", At: time.Now().UTC(), Lease: time.Minute})
				other = fleetHost(t, ff, "h2", nil)
				ff.waitFor(t, "h2 gave the message back", func(ff *fakeFleet) bool { return count(ff.calls, "Later "+job.ID) > 0 })
			}
			ff.mu.Lock()
			ff.calls = nil
			ff.mu.Unlock()

			h1 := fleetHost(t, ff, "h1", nil)
			ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
			ff.mu.Lock()
			end := ff.records[job.ID]
			ff.mu.Unlock()
			if end.EndedBy != "h1" || end.Status != sandbox.StatusSucceeded {
				t.Errorf("ended by %q, %s; want by h1, succeeded", end.EndedBy, end.Status)
			}
			if n := h1.fb.runs[job.ID]; n != 1 {
				t.Errorf("h1 ran it %d times, want 1", n)
			}
			if other != nil && other.fb.runs[job.ID] != 0 {
				t.Errorf("h2 ran a job h1 claimed")
			}
			calls := ff.callsAbout(job.ID)
			hold := slices.Index(calls, "Hold h1 "+job.ID)
			receipt := slices.Index(calls, "Update "+job.ID+" claimed+receipt")
			if hold < 0 || receipt < 0 || hold > receipt {
				t.Errorf("calls %q: want h1's mark written before its receipt (the journal took the job between)", calls)
			}
		})
	}
}

// A restarted host lists the claims it held before it takes a job:
// otherwise its listing could find a claim it had just made, not yet
// journaled, and give it back to the queue while the job runs here.
func TestFleetRestartListsItsClaimsBeforeItTakesAJob(t *testing.T) {
	ff := newFakeFleet()
	listing := make(chan struct{})
	ff.onHeld = func() { <-listing }
	job := newJob(t, "listed-1", "true")
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	h1 := fleetHost(t, ff, "h1", nil)
	time.Sleep(300 * time.Millisecond)
	if calls := ff.callsAbout(job.ID); count(calls, "Hold ") > 0 {
		t.Errorf("calls %q while the host listed its claims: want the job not taken yet", calls)
	}
	close(listing)
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	if calls := ff.callsAbout(job.ID); count(calls, "Update "+job.ID+" queued") > 0 || h1.fb.runs[job.ID] != 1 {
		t.Errorf("calls %q, %d runs: want it claimed, run once, never given back", calls, h1.fb.runs[job.ID])
	}
}

// A job's outputs are put in the fleet's blob store at once, not one
// after the other, all before the record names them.
func TestFleetOutputsArePutAtOnce(t *testing.T) {
	ff := newFakeFleet()
	out, errOut := "out\n", "err\n"
	m := newMeeting(sandbox.DigestBytes([]byte(out)), sandbox.DigestBytes([]byte(errOut)))
	ff.onPut = func(digest string) error {
		switch digest {
		case sandbox.DigestBytes([]byte(out)):
			return m.meet(digest, sandbox.DigestBytes([]byte(errOut)))
		case sandbox.DigestBytes([]byte(errOut)):
			return m.meet(digest, sandbox.DigestBytes([]byte(out)))
		}
		return nil
	}
	h := fleetHost(t, ff, "h1", &[2]string{out, errOut})
	job := newJob(t, "outputs-1", "true")
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	if alone := m.wentAlone(); len(alone) > 0 {
		t.Errorf("%v put alone: want stdout and stderr under way together", alone)
	}
	r := fleet.NewRunner(ff, h.keys)
	sr, err := r.Result(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		digest, want string
	}{{sr.Result.Stdout.Digest, out}, {sr.Result.Stderr.Digest, errOut}} {
		if got, err := r.Blob(context.Background(), l.digest, 1<<10); err != nil || string(got) != l.want {
			t.Errorf("blob %s: %q, %v; want %q", l.digest, got, err, l.want)
		}
	}
}

// An empty log is not put in the fleet's blob store; a reader (the
// runner, another host judging the job) gets it all the same, checked
// against its digest. A record naming a non-empty output the store lacks
// is still an error.
func TestFleetEmptyLogsAreNotStored(t *testing.T) {
	ff := newFakeFleet()
	h1 := fleetHost(t, ff, "h1", &[2]string{"hello\n", ""})
	job := newJob(t, "empty-logs-1", "true")
	// Submitted on h1's own socket: claimed there, published the same.
	if code, _, _ := h1.submit(t, job); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	stdout := sandbox.DigestBytes([]byte("hello\n"))
	if calls := ff.callsAbout(fleet.EmptyDigest); len(calls) != 0 {
		t.Errorf("calls naming the empty digest: %q, want none", calls)
	}
	if calls := ff.callsAbout(stdout); !slices.Contains(calls, "PutBlob "+stdout) {
		t.Errorf("calls naming stdout: %q, want it put", calls)
	}

	r := fleet.NewRunner(ff, h1.keys)
	sr, err := r.Result(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	if sr.Result.Stderr.Digest != fleet.EmptyDigest {
		t.Fatalf("stderr digest %s, want the empty one", sr.Result.Stderr.Digest)
	}
	if got, err := r.Blob(context.Background(), sr.Result.Stderr.Digest, 1<<10); err != nil || len(got) != 0 {
		t.Errorf("the empty stderr through the runner: %q, %v", got, err)
	}

	// Another host reads the job's record and copies its outputs.
	h2 := fleetHost(t, ff, "h2", nil, h1.srv.cfg.Signer.PublicKeyPEM())
	ff.mu.Lock()
	kept := ff.blobs[stdout]
	delete(ff.blobs, stdout)
	ff.mu.Unlock()
	if _, err := h2.srv.fleet.fleetRecord(context.Background(), job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a record naming stdout the store lacks: got %v, want an error wrapping ErrNotFound", err)
	}
	ff.mu.Lock()
	ff.blobs[stdout] = kept
	ff.mu.Unlock()
	rec, err := h2.srv.fleet.fleetRecord(context.Background(), job.ID)
	if err != nil || rec.Status != sandbox.StatusSucceeded {
		t.Fatalf("h2's copy of the record: %s, %v", rec.Status, err)
	}
	for d, want := range map[string][]byte{stdout: []byte("hello\n"), fleet.EmptyDigest: nil} {
		b, err := h2.srv.cfg.Blobs.Open(d)
		if err != nil {
			t.Errorf("h2's store: %s: %v", d, err)
			continue
		}
		var got bytes.Buffer
		got.ReadFrom(b)
		b.Close()
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("h2's store: %s holds %q, want %q", d, got.Bytes(), want)
		}
	}
}

// A result that comes after the fleet ended the job (another host saw its
// claimant's lease lapse) is not taken, though it is written from the
// record as its host last wrote it, with no read first: the write at that
// revision fails, the record is read, and the late result logged.
func TestFleetLateResultIsNotTaken(t *testing.T) {
	ff := newFakeFleet()
	h1, job, open := gatedFleetJob(t, ff, "late-1")
	byOther := ff.rewrite(job.ID, func(r *fleet.Record) {
		r.State, r.EndedBy, r.Status, r.Result = fleet.StateEnded, "h2", sandbox.StatusUncertain, []byte("h2's result")
	})
	open()
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	ff.mu.Lock()
	end := ff.records[job.ID]
	ff.mu.Unlock()
	if end.Revision != byOther.Revision || end.EndedBy != "h2" || !bytes.Equal(end.Result, byOther.Result) {
		t.Errorf("the record after h1's late result: ended by %s at revision %d, want h2's at %d", end.EndedBy, end.Revision, byOther.Revision)
	}
	if n := h1.srv.fleet.counts()["late"]; n != 1 {
		t.Errorf("late results counted: %d, want 1", n)
	}
}

// A result whose record another host's claim holds now (not ended) is
// not taken either, and is counted and logged as such, not as
// published. Before, a declined write was reported "result published".
func TestFleetResultNotTakenFromAnotherHostsClaim(t *testing.T) {
	ff := newFakeFleet()
	h1, job, open := gatedFleetJob(t, ff, "other-claim-1")
	byOther := ff.rewrite(job.ID, func(r *fleet.Record) { r.Host, r.Receipt = "h2", []byte("h2's receipt") })
	open()
	ff.waitFor(t, "h1's message acknowledged", func(ff *fakeFleet) bool {
		return slices.ContainsFunc(ff.msgs, func(m *fakeMsg) bool { return m.id == job.ID && m.state == "acked" })
	})
	ff.mu.Lock()
	end := ff.records[job.ID]
	ff.mu.Unlock()
	if end.Revision != byOther.Revision || end.Host != "h2" || end.State != fleet.StateClaimed {
		t.Errorf("the record after h1's result: %s by %s at revision %d, want h2's claim at %d", end.State, end.Host, end.Revision, byOther.Revision)
	}
	if c := h1.srv.fleet.counts(); c["late"] != 1 || c["published"] != 0 {
		t.Errorf("counted late %d, published %d; want 1 and 0", c["late"], c["published"])
	}
}

// gatedFleetJob has host h1 of ff take a job of id from the queue and run
// it, held at its gate; it returns once the job's receipt is in its
// record, with open to let the job end.
func gatedFleetJob(t *testing.T, ff *fakeFleet, id string) (*fixture, sandbox.Job, func()) {
	t.Helper()
	h := fleetHost(t, ff, "h1", nil)
	job := newJob(t, id, "true")
	gate := make(chan struct{})
	h.fb.mu.Lock()
	h.fb.gates[job.ID] = gate
	h.fb.mu.Unlock()
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the receipt in the record", func(ff *fakeFleet) bool { return ff.records[job.ID].HasReceipt() })
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	return h, job, open
}

// A host with a tenants file takes a tenant's jobs only: a job queued for
// no tenant (by a user of the fleet without tenants) stays queued, is
// not claimed and never runs here; it is given back for a host that
// serves it. (Without the check, the job ran here owned by nobody.)
func TestFleetHostWithTenantsLeavesAJobOfNoTenant(t *testing.T) {
	ff := newFakeFleet()
	ts, err := ParseTenants("t.json", []byte(`{"schema":"sandboxd.tenants/v1","tenants":[{"name":"team-a","identities":[{"role":"submitter","nats_users":["ci-a"]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := newFixture(t, func(cfg *Config) {
		cfg.Name = "h1"
		cfg.Tenants = ts
		cfg.Fleet = &FleetConfig{Coordinator: ff, Lease: time.Minute}
	}, nil)
	job := newJob(t, "no-tenant-1", "true")
	if _, err := ff.Submit(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job given back", func(ff *fakeFleet) bool {
		return slices.ContainsFunc(ff.calls, func(c string) bool { return strings.HasPrefix(c, "Later "+job.ID) })
	})
	time.Sleep(200 * time.Millisecond) // what a host that took it would do next
	rec, err := ff.Record(context.Background(), job.ID)
	if err != nil || rec.State != fleet.StateQueued {
		t.Errorf("the record: %+v, %v, want queued", rec, err)
	}
	if n := count(ff.callsAbout(job.ID), "Hold "); n != 0 {
		t.Errorf("%d held marks written, want none", n)
	}
	h.fb.mu.Lock()
	runs := h.fb.runs[job.ID]
	h.fb.mu.Unlock()
	if runs != 0 {
		t.Errorf("ran %d times", runs)
	}
}

// A job's record removed from the fleet while its host runs it (a writer
// of the records deleted or rolled it up) is bound again as that host's
// claim and ended with its result: published, the message acknowledged.
// Before, the host's publish read the missing record every half second
// for ever, and the unacknowledged message would have found no record at
// its next delivery and run the job again.
func TestFleetRecordGoneWhileTheJobRuns(t *testing.T) {
	ff := newFakeFleet()
	h, job, open := gatedFleetJob(t, ff, "gone-1")
	ff.mu.Lock()
	delete(ff.records, job.ID)
	ff.changeLocked()
	ff.mu.Unlock()
	open()
	ff.waitFor(t, "the job ended in its record", func(ff *fakeFleet) bool {
		r, ok := ff.records[job.ID]
		return ok && r.State == fleet.StateEnded
	})
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	r := fleet.NewRunner(ff, h.keys)
	sr, err := r.Result(context.Background(), job)
	if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Errorf("the fleet's result: %s, %v", sr.Result.Status, err)
	}
	h.fb.mu.Lock()
	runs := h.fb.runs[job.ID]
	h.fb.mu.Unlock()
	if runs != 1 {
		t.Errorf("ran %d times, want once", runs)
	}
}

// requeue queues another message of job, saying its submitter made
// bound: one the stream does not take for a duplicate (with tenants, no
// message has an id it could).
func (ff *fakeFleet) requeue(t *testing.T, job sandbox.Job, bound fleet.Record) {
	t.Helper()
	canon := canonical(t, job)
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.msgs = append(ff.msgs, &fakeMsg{ff: ff, id: job.ID, data: canon, state: "ready", bound: &bound, seq: uint64(len(ff.msgs) + 1)})
	ff.changeLocked()
}

// A message whose word is stale (the record it names has changed since:
// the job ended) is read on its first delivery, not given back: the job
// does not run again, and the mark the failed claim wrote goes.
func TestFleetStaleWordIsReadAtOnce(t *testing.T) {
	ff := newFakeFleet()
	h := fleetHost(t, ff, "h1", nil)
	job := newJob(t, "stale-1", "true")
	made, err := ff.Submit(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	before := len(ff.callsAbout(job.ID))
	ff.requeue(t, job, made)
	ff.waitFor(t, "the message again settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	calls := ff.callsAbout(job.ID)[before:]
	for _, c := range []struct {
		prefix string
		want   int
	}{
		{"Update " + job.ID + " claimed", 1}, {"Record ", 2}, {"Later ", 0}, {"Ack ", 1}, {"Hold ", 1}, {"Release ", 1},
	} {
		if got := count(calls, c.prefix); got != c.want {
			t.Errorf("%q calls: got %d, want %d (calls %q)", c.prefix, got, c.want, calls)
		}
	}
	h.fb.mu.Lock()
	defer h.fb.mu.Unlock()
	if n := h.fb.runs[job.ID]; n != 1 {
		t.Errorf("the job ran %d times, want once", n)
	}
}

// A message with a stale word for a job this host is running (its claim
// made from another message) leaves the held mark the run needs (the
// failed claim's mark is removed only where the record is not this host's
// claim), and is acknowledged: the message the host holds stands for the
// job.
func TestFleetStaleWordKeepsTheMarkOfOurRun(t *testing.T) {
	ff := newFakeFleet()
	h := newFixture(t, func(cfg *Config) {
		cfg.Name, cfg.Concurrency = "h1", 2 // a slot free for the message again
		cfg.Fleet = &FleetConfig{Coordinator: ff, Lease: time.Minute}
	}, nil)
	job := newJob(t, "stale-2", "true")
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	h.fb.mu.Lock()
	h.fb.gates[job.ID] = gate
	h.fb.mu.Unlock()
	made, err := ff.Submit(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	ff.waitFor(t, "the job running, its receipt written", func(ff *fakeFleet) bool { return ff.records[job.ID].HasReceipt() })
	before := len(ff.callsAbout(job.ID))
	ff.requeue(t, job, made)
	ff.waitFor(t, "the message again acknowledged", func(ff *fakeFleet) bool { return ff.msgs[len(ff.msgs)-1].state == "acked" })
	calls := ff.callsAbout(job.ID)[before:]
	if count(calls, "Release ") != 0 {
		t.Errorf("the held mark of the running job was removed: calls %q", calls)
	}
	// The message again is acknowledged, not given back: given back, the
	// two messages of the job brought each other back while it ran.
	if count(calls, "Later ") != 0 || count(calls, "Ack ") != 1 {
		t.Errorf("the message again: calls %q, want one acknowledgement and nothing given back", calls)
	}
	open()
	ff.waitFor(t, "the job settled", func(ff *fakeFleet) bool { return ff.settled(job.ID) })
	h.fb.mu.Lock()
	defer h.fb.mu.Unlock()
	if n := h.fb.runs[job.ID]; n != 1 {
		t.Errorf("the job ran %d times, want once", n)
	}
}
