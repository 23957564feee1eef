package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Schemas of the fleet's wire forms.
const (
	RecordSchema = "sandboxd-fleet-job/1"
	HostSchema   = "sandboxd-fleet-host/1"
)

// State is where a job is in the fleet.
type State string

const (
	StateQueued  State = "queued"
	StateClaimed State = "claimed"
	StateEnded   State = "ended"
)

// Record is a job's one fleet-wide record. Revision is the coordinator's
// (not part of the stored value): an Update succeeds only at the revision
// it was read at.
type Record struct {
	Schema      string    `json:"schema"`
	ID          string    `json:"id"`
	Digest      string    `json:"digest"`
	State       State     `json:"state"`
	SubmittedAt time.Time `json:"submitted_at"`
	// Host holds the claim, from ClaimedAt.
	Host      string    `json:"host,omitempty"`
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
	// WallTime is the job's wall-time limit, copied at the claim: a
	// claim's lease runs at least this long past ClaimedAt.
	WallTime time.Duration `json:"wall_time,omitempty"`
	// Receipt is the claiming host's DSSE receipt envelope, once its
	// journal accepted the job.
	Receipt []byte `json:"receipt,omitempty"`
	// Result is the DSSE result envelope; EndedBy the host that signed it.
	Result  []byte `json:"result,omitempty"`
	EndedBy string `json:"ended_by,omitempty"`
	// ReceiptBlob and ResultBlob name an envelope too large for the record
	// (over InlineEnvelope bytes), kept in the blob store under its digest
	// instead; the envelope fields are then empty.
	ReceiptBlob string `json:"receipt_blob,omitempty"`
	ResultBlob  string `json:"result_blob,omitempty"`
	// Status is the result's status, for operators (the envelope is the
	// authority).
	Status sandbox.Status `json:"status,omitempty"`

	Revision uint64 `json:"-"`
}

// Host is a daemon's heartbeat: it holds its claims while At is fresh.
type Host struct {
	Schema      string    `json:"schema"`
	Name        string    `json:"name"`
	Version     string    `json:"version"`
	KeyID       string    `json:"key_id"`
	Concurrency int       `json:"concurrency"`
	Running     int       `json:"running"`
	At          time.Time `json:"at"`
	// Lease is how long after At (and after a claim's deadline) its claims
	// hold if no heartbeat follows.
	Lease time.Duration `json:"lease"`
}

// Errors a Coordinator returns besides the sandbox error classes.
var (
	// ErrRevision: the record changed since it was read; read it again.
	ErrRevision = errors.New("fleet record changed since it was read")
	// ErrNoMessage: no job message arrived within the wait.
	ErrNoMessage = errors.New("no job message")
	// ErrUnavailable: the coordinator did not answer in time (no quorum, a
	// leader election, a network fault). A write that failed so may have
	// been made.
	ErrUnavailable = errors.New("fleet unavailable")
	// ErrDenied: the NATS servers refused a call by the user's
	// permissions (a tenant's user acting for another tenant, a reader
	// submitting). It is not ErrUnavailable: trying again changes
	// nothing, and the write refused was not made (a step of the same
	// call before it may have been: a record bound, its message refused).
	ErrDenied = errors.New("refused by the fleet's NATS permissions")
	// ErrNoRoom: the NATS servers cannot reserve what a stream or store
	// asks of their file store (a blob store larger than their
	// max_file_store). Trying again changes nothing.
	ErrNoRoom = errors.New("the fleet's NATS servers have no room for it")
)

// The blob store's bounds unless Options say otherwise.
const (
	DefaultBlobBytes = 50 << 30
	DefaultBlobAge   = 7 * 24 * time.Hour
)

// Coordinator holds the fleet's state: records, the job queue, blobs and
// hosts. Every call is bounded by its own short timeout as well as ctx.
type Coordinator interface {
	// Submit binds job.ID to job.Digest fleet-wide (or finds it bound) and,
	// while no host has claimed it, queues it (again: the queue drops a
	// duplicate). Another digest under the id is an error wrapping
	// sandbox.ErrConflict, and nothing is queued.
	Submit(ctx context.Context, job sandbox.Job) (Record, error)
	// Claim binds job.ID to job.Digest fleet-wide already claimed by
	// host, for a job submitted to that host itself: nothing is queued.
	// made reports whether this call bound it; a job bound before is
	// not claimed here, and its record comes back (another digest under
	// the id is an error wrapping sandbox.ErrConflict). A call that timed
	// out may have claimed it (ErrUnavailable).
	Claim(ctx context.Context, job sandbox.Job, host string) (rec Record, made bool, err error)
	// Record returns a job's record (sandbox.ErrNotFound if none).
	Record(ctx context.Context, id string) (Record, error)
	// Watch returns the job's record once done(record) holds, or ctx's
	// error.
	Watch(ctx context.Context, id string, done func(Record) bool) (Record, error)
	// Update writes rec if the record is still at rec.Revision
	// (ErrRevision otherwise) and returns it at its new revision.
	Update(ctx context.Context, rec Record) (Record, error)
	// Next waits up to wait for one job message (ErrNoMessage).
	Next(ctx context.Context, wait time.Duration) (*Delivery, error)

	// Hold marks that host holds id's claim; Release removes the mark;
	// Held lists the claims host holds, of every tenant (what a restarted
	// host finishes).
	Hold(ctx context.Context, host, id string) error
	Release(ctx context.Context, host, id string) error
	Held(ctx context.Context, host string) ([]Claim, error)

	// Tenant is the fleet as tenant name sees it: its jobs' records, the
	// subject its jobs are queued on, its blobs, and its hosts' held
	// marks; "" is the fleet without tenants. A host takes every tenant's
	// jobs (Delivery.Tenant) and answers each through its tenant's view;
	// a submitter opened for a tenant is that tenant's view already.
	Tenant(ctx context.Context, name string) (Coordinator, error)

	// PutBlob stores content under its sha256 digest (checked; bytes
	// already there are not sent again). Blob opens one, or wraps
	// sandbox.ErrNotFound; the reader fails at EOF if the bytes do not
	// hash to digest. The empty content (EmptyDigest) is never stored:
	// PutBlob of it sends nothing, and Blob serves it without a read.
	PutBlob(ctx context.Context, digest string, size int64, r io.Reader) error
	Blob(ctx context.Context, digest string) (io.ReadCloser, error)

	// Heartbeat publishes a host's liveness; Hosts lists them.
	Heartbeat(ctx context.Context, h Host) error
	Hosts(ctx context.Context) ([]Host, error)
}

// EmptyDigest is the sha256 digest of no bytes: the stdout or stderr of
// most jobs. Its content is known, so the fleet never stores it (two
// blob store round trips fewer per job that writes nothing) and serves
// it without a read; a reader checks it against its digest as any other.
// Every other digest a record names must be in the blob store.
const EmptyDigest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Claim is a job a host holds: its tenant ("" without tenants) and id.
type Claim struct {
	Tenant, ID string
}

// Delivery is one job message. Job is set if the message decoded into a
// sealed job whose digest verifies; otherwise Err says why, and the
// message is refused (Refuse) and never runs.
type Delivery struct {
	Job sandbox.Job
	Err error
	// Tenant is whose job it is ("" without tenants): the subject it was
	// queued on, which only that tenant's users may publish to.
	Tenant string
	// Delivered counts deliveries of this message (1 the first time).
	Delivered uint64
	// Queued is when the queue stored the message, by its server's clock
	// (zero if the queue does not say).
	Queued time.Time
	// Seq is the message's place in the queue (0 if the queue does not
	// say): two deliveries of one message have the same, two messages of
	// one job (queued again) do not.
	Seq uint64
	// Bound is the record its submitter says it made for the job just
	// before it queued it (queued, at a revision; nil if it says nothing).
	// A hint, never the fleet's word: a claim made on it is a
	// compare-and-set at that revision, which fails once the record has
	// been written since (the record is then read). A message naming the
	// record's current revision has it claimed whatever it holds: only a
	// submitter can queue one, and a submitter may write its records
	// anyway (docs/fleet.md).
	Bound *Record
	msg   Message
}

// Message is a queue's hold on one delivered job message, as a
// Coordinator gives it to NewDelivery.
type Message interface {
	// Ack acknowledges it, once the queue has taken the word.
	Ack(ctx context.Context) error
	// Later gives it back, to be delivered again after delay.
	Later(delay time.Duration) error
	// Working says it is still being worked on.
	Working() error
	// Refuse drops it for good.
	Refuse() error
}

// NewDelivery is a delivered job message: data decoded as a sealed job
// (or Err), and m, the queue's hold on it. Coordinators (and their
// fakes) make their deliveries with it.
func NewDelivery(data []byte, delivered uint64, m Message) *Delivery {
	d := &Delivery{Delivered: delivered, msg: m}
	job, err := sandbox.DecodeJob(data)
	if err != nil {
		d.Err = fmt.Errorf("a job message is not a sealed job: %w", err)
		return d
	}
	d.Job = job
	return d
}

// Done acknowledges the message: the job's outcome is durable in its
// record.
func (d *Delivery) Done(ctx context.Context) error { return d.msg.Ack(ctx) }

// Later gives the message back, to be delivered again after delay.
func (d *Delivery) Later(delay time.Duration) error { return d.msg.Later(delay) }

// Working tells the queue that the message is still being worked on.
func (d *Delivery) Working() error { return d.msg.Working() }

// Refuse drops a message that can never run (malformed, a digest that
// does not verify, an id bound to another digest).
func (d *Delivery) Refuse() error { return d.msg.Refuse() }

// keyRE is what an id becomes in a key: job ids are [A-Za-z0-9._-], and a
// dot separates key tokens, so it is written as '=' (not in the id
// alphabet: the mapping is one to one).
func keyOf(id string) string { return strings.ReplaceAll(id, ".", "=") }

func idOfKey(k string) string { return strings.ReplaceAll(k, "=", ".") }

// hostRE is the host name grammar, at most 63 bytes (validName): a
// counted repetition would compile into 62 copies of its class.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

func validName(s string) bool { return len(s) <= 63 && hostRE.MatchString(s) }

// CheckTenantName refuses a tenant name the fleet cannot name subjects,
// keys and buckets by (the host name grammar).
func CheckTenantName(name string) error {
	if !validName(name) {
		return fmt.Errorf("fleet tenant name %q is not 1-63 characters of [A-Za-z0-9_-] starting with a letter or digit: %w", name, sandbox.ErrInvalid)
	}
	return nil
}

// CheckHostName refuses a host name the fleet cannot key by.
func CheckHostName(name string) error {
	if !validName(name) {
		return fmt.Errorf("fleet host name %q is not 1-63 characters of [A-Za-z0-9_-] starting with a letter or digit: %w", name, sandbox.ErrInvalid)
	}
	return nil
}

// Expiry is when a claim of host h lapses if h sends no heartbeat after
// h.At: a lease past the later of the host's last heartbeat and the job's
// own deadline (a host that returns within it recovers the job).
func Expiry(rec Record, h Host) time.Time {
	at := h.At
	if d := rec.ClaimedAt.Add(rec.WallTime); d.After(at) {
		at = d
	}
	return at.Add(h.Lease)
}

// InlineEnvelope is the largest envelope a record holds itself: a record
// is one key-value entry (at most 1 MiB, its envelopes base64 in JSON).
const InlineEnvelope = 256 << 10

// HasReceipt reports whether the record holds a receipt, inline or not.
func (r Record) HasReceipt() bool { return len(r.Receipt) > 0 || r.ReceiptBlob != "" }

// SetReceipt and SetResult put an envelope in the record, or, if it is
// larger than InlineEnvelope, in the blob store with its digest in the
// record.
func SetReceipt(ctx context.Context, co Coordinator, r *Record, env []byte) error {
	return setEnvelope(ctx, co, env, &r.Receipt, &r.ReceiptBlob)
}

// SetResult: see SetReceipt.
func SetResult(ctx context.Context, co Coordinator, r *Record, env []byte) error {
	return setEnvelope(ctx, co, env, &r.Result, &r.ResultBlob)
}

func setEnvelope(ctx context.Context, co Coordinator, env []byte, inline *[]byte, blob *string) error {
	if len(env) <= InlineEnvelope {
		*inline, *blob = env, ""
		return nil
	}
	d := sandbox.DigestBytes(env)
	if err := co.PutBlob(ctx, d, int64(len(env)), bytes.NewReader(env)); err != nil {
		return err
	}
	*inline, *blob = nil, d
	return nil
}

// Envelopes returns the record's receipt and result envelopes (nil if it
// has none yet), reading from the blob store those kept there, each
// checked against its digest.
func Envelopes(ctx context.Context, co Coordinator, r Record) (receipt, result []byte, err error) {
	if receipt, err = envelope(ctx, co, r.Receipt, r.ReceiptBlob); err != nil {
		return nil, nil, fmt.Errorf("job %s: receipt: %w", r.ID, err)
	}
	if result, err = envelope(ctx, co, r.Result, r.ResultBlob); err != nil {
		return nil, nil, fmt.Errorf("job %s: result: %w", r.ID, err)
	}
	return receipt, result, nil
}

// maxEnvelope bounds an envelope read from the blob store (a result is
// bounded by sandbox.MaxResultBytes).
const maxEnvelope = sandbox.MaxResultBytes

func envelope(ctx context.Context, co Coordinator, inline []byte, blob string) ([]byte, error) {
	if blob == "" {
		return inline, nil
	}
	return readBlob(ctx, co, blob, maxEnvelope)
}

// readBlob reads a blob of at most max bytes, checked against its digest
// (the coordinator's reader fails at EOF otherwise).
func readBlob(ctx context.Context, co Coordinator, digest string, max int64) ([]byte, error) {
	rc, err := co.Blob(ctx, digest)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("blob %s is larger than %d bytes: %w", digest, max, sandbox.ErrTooLarge)
	}
	return b, nil
}
