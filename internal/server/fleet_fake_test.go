package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// fakeFleet is an in-memory fleet.Coordinator, as JetStream keeps the
// fleet: records changed only by compare-and-set on a revision the bucket
// counts (held marks count in it too), a queue whose messages come back
// until acknowledged, blobs checked by digest (the empty one implicit),
// and hooks where a test holds or fails a call. It logs each call about a
// job ("Hold h1 j1", "Update j1 claimed+receipt", "PutBlob sha256:…").
type fakeFleet struct {
	mu      sync.Mutex
	rev     uint64
	records map[string]fleet.Record
	held    map[string]bool // host + " " + id
	blobs   map[string][]byte
	hosts   map[string]fleet.Host
	msgs    []*fakeMsg
	calls   []string
	// changed is closed (and replaced) at every change.
	changed chan struct{}

	// Hooks, called before the call does anything; an error fails it.
	onHold   func(host, id string) error
	onUpdate func(rec fleet.Record) error
	onPut    func(digest string) error
	onHeld   func()
	onRecord func(id string) error
}

var _ fleet.Coordinator = (*fakeFleet)(nil)

func newFakeFleet() *fakeFleet {
	return &fakeFleet{records: map[string]fleet.Record{}, held: map[string]bool{}, blobs: map[string][]byte{},
		hosts: map[string]fleet.Host{}, changed: make(chan struct{})}
}

// changeLocked wakes whoever waits for a change.
func (ff *fakeFleet) changeLocked() {
	close(ff.changed)
	ff.changed = make(chan struct{})
}

func (ff *fakeFleet) log(format string, args ...any) {
	ff.mu.Lock()
	ff.calls = append(ff.calls, fmt.Sprintf(format, args...))
	ff.mu.Unlock()
}

// callsAbout returns the logged calls naming id.
func (ff *fakeFleet) callsAbout(id string) []string {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	var out []string
	for _, c := range ff.calls {
		if slices.Contains(strings.Fields(c), id) {
			out = append(out, c)
		}
	}
	return out
}

func stateOf(r fleet.Record) string {
	if r.State == fleet.StateClaimed && r.HasReceipt() {
		return "claimed+receipt"
	}
	return string(r.State)
}

// put writes a record as it is (the state a crash left), at a new
// revision.
func (ff *fakeFleet) put(rec fleet.Record) fleet.Record {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.rev++
	rec.Schema, rec.Revision = fleet.RecordSchema, ff.rev
	ff.records[rec.ID] = rec
	ff.changeLocked()
	return rec
}

// rewrite changes the job's record as another writer of the fleet would,
// and returns it as written.
func (ff *fakeFleet) rewrite(id string, change func(*fleet.Record)) fleet.Record {
	ff.mu.Lock()
	rec := ff.records[id]
	ff.mu.Unlock()
	change(&rec)
	return ff.put(rec)
}

// queue puts a message of job in the queue.
func (ff *fakeFleet) queue(t *testing.T, job sandbox.Job) {
	t.Helper()
	canon := canonical(t, job)
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.queueLocked(job.ID, canon)
}

// canonical is job's canonical form, a message's body.
func canonical(t *testing.T, job sandbox.Job) []byte {
	t.Helper()
	canon, err := job.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return canon
}

func (ff *fakeFleet) queueLocked(id string, data []byte) { ff.queueBoundLocked(id, data, nil) }

// queueBoundLocked queues a message saying its submitter made record bound
// (nil: saying nothing), as JetStream's submit does.
func (ff *fakeFleet) queueBoundLocked(id string, data []byte, bound *fleet.Record) {
	for _, m := range ff.msgs {
		if m.id == id && m.state != "acked" && m.state != "refused" {
			return // the stream drops a duplicate
		}
	}
	ff.msgs = append(ff.msgs, &fakeMsg{ff: ff, id: id, data: data, state: "ready", bound: bound, seq: uint64(len(ff.msgs) + 1)})
	ff.changeLocked()
}

// waitFor waits up to a while for cond, checked under the lock at every
// change.
func (ff *fakeFleet) waitFor(t *testing.T, what string, cond func(ff *fakeFleet) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ff.mu.Lock()
		ok, ch := cond(ff), ff.changed
		ff.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: not within 10s; the calls: %q", what, ff.calls)
		}
	}
}

// settled: the job's record ended, its message acknowledged and no mark
// held.
func (ff *fakeFleet) settled(id string) bool {
	if ff.records[id].State != fleet.StateEnded {
		return false
	}
	for _, m := range ff.msgs {
		if m.id == id && m.state != "acked" {
			return false
		}
	}
	for k := range ff.held {
		if strings.HasSuffix(k, " "+id) {
			return false
		}
	}
	return true
}

func (ff *fakeFleet) bind(job sandbox.Job, rec fleet.Record) (fleet.Record, bool, error) {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if have, ok := ff.records[job.ID]; ok {
		if have.Digest != job.Digest {
			return have, false, fmt.Errorf("job %s is bound to %s: %w", job.ID, have.Digest, sandbox.ErrConflict)
		}
		return have, false, nil
	}
	ff.rev++
	rec.Revision = ff.rev
	ff.records[job.ID] = rec
	ff.changeLocked()
	return rec, true, nil
}

func (ff *fakeFleet) Submit(_ context.Context, job sandbox.Job) (fleet.Record, error) {
	ff.log("Submit %s", job.ID)
	rec, made, err := ff.bind(job, fleet.Record{Schema: fleet.RecordSchema, ID: job.ID, Digest: job.Digest, State: fleet.StateQueued, SubmittedAt: time.Now().UTC()})
	if err != nil || rec.State != fleet.StateQueued {
		return rec, err
	}
	canon, err := job.CanonicalJSON()
	if err != nil {
		return rec, err
	}
	var bound *fleet.Record
	if made {
		b := rec
		bound = &b
	}
	ff.mu.Lock()
	ff.queueBoundLocked(job.ID, canon, bound)
	ff.mu.Unlock()
	return rec, nil
}

func (ff *fakeFleet) Claim(_ context.Context, job sandbox.Job, host string) (fleet.Record, bool, error) {
	ff.log("Claim %s %s", host, job.ID)
	now := time.Now().UTC()
	return ff.bind(job, fleet.Record{Schema: fleet.RecordSchema, ID: job.ID, Digest: job.Digest, State: fleet.StateClaimed,
		SubmittedAt: now, Host: host, ClaimedAt: now, WallTime: job.Limits.WallTime()})
}

func (ff *fakeFleet) Record(_ context.Context, id string) (fleet.Record, error) {
	ff.log("Record %s", id)
	if ff.onRecord != nil {
		if err := ff.onRecord(id); err != nil {
			return fleet.Record{}, err
		}
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	rec, ok := ff.records[id]
	if !ok {
		return fleet.Record{}, fmt.Errorf("fleet: job %s: %w", id, sandbox.ErrNotFound)
	}
	return rec, nil
}

func (ff *fakeFleet) Watch(ctx context.Context, id string, done func(fleet.Record) bool) (fleet.Record, error) {
	for {
		ff.mu.Lock()
		rec, ok := ff.records[id]
		ch := ff.changed
		ff.mu.Unlock()
		if ok && done(rec) {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return fleet.Record{}, ctx.Err()
		case <-ch:
		}
	}
}

func (ff *fakeFleet) Update(_ context.Context, rec fleet.Record) (fleet.Record, error) {
	ff.log("Update %s %s", rec.ID, stateOf(rec))
	if ff.onUpdate != nil {
		if err := ff.onUpdate(rec); err != nil {
			return fleet.Record{}, err
		}
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if have := ff.records[rec.ID]; have.Revision != rec.Revision {
		return fleet.Record{}, fmt.Errorf("job %s at revision %d, not %d: %w", rec.ID, have.Revision, rec.Revision, fleet.ErrRevision)
	}
	ff.rev++
	rec.Schema, rec.Revision = fleet.RecordSchema, ff.rev
	ff.records[rec.ID] = rec
	ff.changeLocked()
	return rec, nil
}

func (ff *fakeFleet) Next(ctx context.Context, wait time.Duration) (*fleet.Delivery, error) {
	deadline := time.After(wait)
	for {
		ff.mu.Lock()
		for _, m := range ff.msgs {
			if m.state == "ready" {
				m.state = "out"
				m.delivered++
				ff.mu.Unlock()
				d := fleet.NewDelivery(m.data, m.delivered, m)
				d.Seq = m.seq
				if d.Err == nil {
					d.Bound = m.bound
				}
				return d, nil
			}
		}
		ch := ff.changed
		ff.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline:
			return nil, fleet.ErrNoMessage
		case <-ch:
		}
	}
}

// fakeMsg is a queued message: ready, out (with a host), acked or
// refused. A message given back comes back after at most 50ms, whatever
// the delay asked (the tests' hosts need not wait out leases).
type fakeMsg struct {
	ff        *fakeFleet
	id        string
	data      []byte
	delivered uint64
	state     string
	bound     *fleet.Record // the record its submitter says it made
	seq       uint64        // its place in the queue
}

func (m *fakeMsg) set(from, to string) {
	m.ff.mu.Lock()
	defer m.ff.mu.Unlock()
	if m.state == from || from == "" {
		m.state = to
		m.ff.changeLocked()
	}
}

func (m *fakeMsg) Ack(context.Context) error {
	m.ff.log("Ack %s", m.id)
	m.set("", "acked")
	return nil
}

func (m *fakeMsg) Later(delay time.Duration) error {
	m.ff.log("Later %s", m.id)
	time.AfterFunc(min(delay, 50*time.Millisecond), func() { m.set("out", "ready") })
	return nil
}

func (m *fakeMsg) Working() error { return nil }

func (m *fakeMsg) Refuse() error {
	m.ff.log("Refuse %s", m.id)
	m.set("", "refused")
	return nil
}

func (ff *fakeFleet) Hold(_ context.Context, host, id string) error {
	ff.log("Hold %s %s", host, id)
	if ff.onHold != nil {
		if err := ff.onHold(host, id); err != nil {
			return err
		}
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.rev++
	ff.held[host+" "+id] = true
	ff.changeLocked()
	return nil
}

func (ff *fakeFleet) Release(_ context.Context, host, id string) error {
	ff.log("Release %s %s", host, id)
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if ff.held[host+" "+id] {
		ff.rev++
		delete(ff.held, host+" "+id)
		ff.changeLocked()
	}
	return nil
}

func (ff *fakeFleet) Held(_ context.Context, host string) ([]fleet.Claim, error) {
	if ff.onHeld != nil {
		ff.onHeld()
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	var held []fleet.Claim
	for k := range ff.held {
		if h, id, _ := strings.Cut(k, " "); h == host {
			held = append(held, fleet.Claim{ID: id})
		}
	}
	slices.SortFunc(held, func(a, b fleet.Claim) int { return strings.Compare(a.ID, b.ID) })
	return held, nil
}

// Tenant is the fake's fleet without tenants; it has no others.
func (ff *fakeFleet) Tenant(_ context.Context, name string) (fleet.Coordinator, error) {
	if name != "" {
		return nil, fmt.Errorf("the fake fleet has no tenant %q", name)
	}
	return ff, nil
}

func (ff *fakeFleet) PutBlob(_ context.Context, digest string, size int64, r io.Reader) error {
	ff.log("PutBlob %s", digest)
	if ff.onPut != nil {
		if err := ff.onPut(digest); err != nil {
			return err
		}
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if sandbox.DigestBytes(b) != digest || int64(len(b)) != size {
		return fmt.Errorf("blob %s: the bytes sent do not hash to it: %w", digest, sandbox.ErrInvalid)
	}
	if digest == fleet.EmptyDigest {
		return nil // never stored
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.blobs[digest] = b
	return nil
}

func (ff *fakeFleet) Blob(_ context.Context, digest string) (io.ReadCloser, error) {
	ff.log("Blob %s", digest)
	if digest == fleet.EmptyDigest {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	b, ok := ff.blobs[digest]
	if !ok {
		return nil, fmt.Errorf("fleet: blob %s: %w", digest, sandbox.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (ff *fakeFleet) Heartbeat(_ context.Context, h fleet.Host) error {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	ff.hosts[h.Name] = h
	return nil
}

func (ff *fakeFleet) Hosts(context.Context) ([]fleet.Host, error) {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	var out []fleet.Host
	for _, h := range ff.hosts {
		out = append(out, h)
	}
	return out, nil
}

// logsBroker is the fake broker with a job's stdout and stderr: written
// to this host's blob store, as the real broker's collection does.
type logsBroker struct {
	*fakeBroker
	blobs          *store.Store
	stdout, stderr []byte
}

func (b logsBroker) RunWithHooks(ctx context.Context, job sandbox.Job, h broker.Hooks) (sandbox.Result, error) {
	res, err := b.fakeBroker.RunWithHooks(ctx, job, h)
	for _, l := range []struct {
		log     *sandbox.Log
		content []byte
	}{{&res.Stdout, b.stdout}, {&res.Stderr, b.stderr}} {
		d, perr := b.blobs.PutBytes(l.content)
		if perr != nil {
			return res, perr
		}
		*l.log = sandbox.Log{Digest: d, Bytes: int64(len(l.content)), Total: int64(len(l.content))}
	}
	return res, err
}

// fleetHost is a daemon named name joined to ff; logs, if set, are what
// its jobs write.
func fleetHost(t *testing.T, ff *fakeFleet, name string, logs *[2]string, keys ...[]byte) *fixture {
	t.Helper()
	return newFixture(t, func(cfg *Config) {
		cfg.Name = name
		cfg.Fleet = &FleetConfig{Coordinator: ff, Lease: time.Minute, Keys: keys}
		if logs != nil {
			cfg.Broker = logsBroker{fakeBroker: cfg.Broker.(*fakeBroker), blobs: cfg.Blobs, stdout: []byte(logs[0]), stderr: []byte(logs[1])}
		}
	}, nil)
}

// meeting is two writes that must be under way at the same time: each
// waits (up to 2s) for the other to begin; alone reports one that did
// not see the other.
type meeting struct {
	mu      sync.Mutex
	arrived map[string]chan struct{}
	alone   []string
}

func newMeeting(a, b string) *meeting {
	return &meeting{arrived: map[string]chan struct{}{a: make(chan struct{}), b: make(chan struct{})}}
}

// meet is side's arrival: the first one only; later ones pass.
func (m *meeting) meet(side, other string) error {
	m.mu.Lock()
	ch := m.arrived[side]
	first := ch != nil
	if first {
		close(ch)
		m.arrived[side] = nil
		m.arrived[side+" done"] = ch
	}
	otherCh := m.arrived[other]
	if otherCh == nil {
		otherCh = m.arrived[other+" done"]
	}
	m.mu.Unlock()
	if !first {
		return nil
	}
	select {
	case <-otherCh:
		return nil
	case <-time.After(2 * time.Second):
		m.mu.Lock()
		m.alone = append(m.alone, side)
		m.mu.Unlock()
		return fmt.Errorf("the %s went alone: the %s was not under way", side, other)
	}
}

func (m *meeting) wentAlone() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.alone)
}
