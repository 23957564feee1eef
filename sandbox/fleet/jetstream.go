package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandboxd/sandboxd/sandbox"
)

// The JetStream layout. Every name is fixed: a fleet is one NATS account.
// A tenant's jobs, records and blobs have names of their own (each
// function below), so that NATS permissions can give each tenant its own
// and nothing of another's (docs/fleet.md, Permissions); the fleet
// without tenants ("") keeps the names it had before tenants.
const (
	jobsStream   = "SANDBOXD_JOBS"
	jobsSubject  = "sandboxd.jobs"
	consumerName = "sandboxd-hosts"
	recordBucket = "sandboxd-jobs"
	hostBucket   = "sandboxd-hosts"
	blobBucket   = "sandboxd-blobs"
)

// jobsSubjectOf is the subject tenant's jobs are queued on.
func jobsSubjectOf(tenant string) string {
	if tenant == "" {
		return jobsSubject
	}
	return jobsSubject + "." + tenant
}

// tenantOfSubject is the tenant a job message's subject names.
func tenantOfSubject(subject string) (string, error) {
	if subject == jobsSubject {
		return "", nil
	}
	t, ok := strings.CutPrefix(subject, jobsSubject+".")
	if !ok {
		return "", fmt.Errorf("a job message on subject %q, not %s or %s.<tenant>", subject, jobsSubject, jobsSubject)
	}
	if err := CheckTenantName(t); err != nil {
		return "", err
	}
	return t, nil
}

// recordBucketOf is tenant's key-value bucket of job records: a tenant
// reads, watches and writes its own bucket only (a bucket shared by
// tenants would tell each every key, and a rollup publish on any key of
// it purges all of it). The fleet's own bucket (recordBucket) also holds
// the hosts' held marks, which only hosts may write.
func recordBucketOf(tenant string) string {
	if tenant == "" {
		return recordBucket
	}
	return recordBucket + "-" + tenant
}

// blobBucketOf is tenant's object store: a tenant never reads another's
// blobs, whatever digests it knows.
func blobBucketOf(tenant string) string {
	if tenant == "" {
		return blobBucket
	}
	return blobBucket + "-" + tenant
}

// Options configure a JetStream coordinator.
type Options struct {
	// URLs are the NATS servers (nats:// or tls://), comma-joined or not.
	URLs []string
	// Creds is a NATS credentials file; TLSCA, TLSCert and TLSKey are PEM
	// files for TLS (the client pair for mutual TLS).
	Creds, TLSCA, TLSCert, TLSKey string
	// Name names the connection (the host or the submitter).
	Name string
	// Replicas of each stream and bucket (1, 3 or 5; default 3).
	Replicas int
	// CallTimeout bounds each JetStream call (default 5s): a call with
	// none blocked 85 s here when its stream leader died.
	CallTimeout time.Duration
	// AckWait is how long a delivered message stays with one host without
	// word from it before it is delivered again (default 30s).
	AckWait time.Duration
	// MaxJobBytes caps a job message (default 1 MiB).
	MaxJobBytes int32
	// BlobBytes and BlobAge bound the blob store (DefaultBlobBytes,
	// DefaultBlobAge); RecordAge bounds how long records are kept (default
	// 30 days).
	BlobBytes          int64
	BlobAge, RecordAge time.Duration
	// Setup creates or updates the streams and buckets (a host does; a
	// submitter only binds to them, as its permissions allow).
	Setup bool
	// Tenant is the tenant a submitter acts for: Open returns the fleet
	// as Tenant(Tenant) sees it (its records, queue subject and blob
	// store), which is what the NATS user's permissions allow. Empty: the
	// fleet without tenants. A host (Setup) leaves it empty.
	Tenant string
	// Tenants are created their blob stores at Setup (a host's tenants
	// file); Tenant creates one on first use as well. A fleet with
	// tenants has no blob store without one.
	Tenants []string
	// TenantBlobBytes bounds a tenant's blob store (JetStream reserves
	// it); a tenant not named has an equal share of BlobBytes.
	TenantBlobBytes map[string]int64
	// InboxPrefix replaces NATS's "_INBOX" as the prefix of the subjects
	// the answers to this connection's requests come on (default
	// "_INBOX_<Tenant>" with a Tenant): a tenant's users may subscribe
	// to its prefix only, never to the replies another tenant's
	// reads get.
	InboxPrefix string
}

// JetStream is the NATS JetStream coordinator: the fleet as one tenant
// sees it (Tenant), sharing its connection with the other tenants' views.
type JetStream struct {
	opt     Options
	nc      *nats.Conn
	js      jetstream.JetStream
	records jetstream.KeyValue // the tenant's
	marks   jetstream.KeyValue // the hosts' held marks (nil for a tenant's submitter)
	hosts   jetstream.KeyValue
	tenant  string
	blobs   jetstream.ObjectStore // the tenant's
	leader  msgGets
	cons    jetstream.Consumer // nil until Next is first called
	views   *views
	denials *denials
	// leaderReadDenied: this view's user may not read its records from
	// their stream's leader (permissions from before that read: Record).
	leaderReadDenied atomic.Bool
	// directDenied: this view's user may not make direct gets of its
	// blobs' chunks (permissions from before those: Blob); they are the
	// leader's gets alone.
	directDenied atomic.Bool
}

// denials are the permission violations the servers reported on the
// connection (asynchronously: a refused publish or request is otherwise
// only a timeout).
type denials struct {
	mu   sync.Mutex
	at   time.Time
	last error
}

func (d *denials) add(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	d.mu.Lock()
	d.at, d.last = time.Now(), err
	d.mu.Unlock()
}

// since is the last violation reported at or after t, if any.
func (d *denials) since(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil || d.at.Before(t) {
		return nil
	}
	return d.last
}

// denied is err as ErrDenied if it is a call's time-out (ErrUnavailable)
// and the servers reported a permission violation since the call began.
func (f *JetStream) denied(err error, began time.Time) error {
	if !errors.Is(err, ErrUnavailable) {
		return err
	}
	if v := f.denials.since(began); v != nil {
		return fmt.Errorf("%w: %v (check the NATS user's permissions and --fleet-tenant: docs/fleet.md): %w", ErrDenied, v, sandbox.ErrInvalid)
	}
	return err
}

// views are a connection's tenant views, made once each.
type views struct {
	mu sync.Mutex
	m  map[string]*JetStream
}

var _ Coordinator = (*JetStream)(nil)

// Open connects to the fleet's NATS servers and binds to (or, with
// Setup, creates) its streams and buckets.
func Open(ctx context.Context, opt Options) (*JetStream, error) {
	if len(opt.URLs) == 0 {
		return nil, fmt.Errorf("fleet: no NATS server URL: %w", sandbox.ErrInvalid)
	}
	if opt.Replicas == 0 {
		opt.Replicas = 3
	}
	if opt.Replicas != 1 && opt.Replicas != 3 && opt.Replicas != 5 {
		return nil, fmt.Errorf("fleet: %d replicas: %w: 1, 3 or 5", opt.Replicas, sandbox.ErrInvalid)
	}
	if opt.CallTimeout <= 0 {
		opt.CallTimeout = 5 * time.Second
	}
	if opt.AckWait <= 0 {
		opt.AckWait = 30 * time.Second
	}
	if opt.MaxJobBytes <= 0 {
		opt.MaxJobBytes = 1 << 20
	}
	if opt.BlobBytes <= 0 {
		opt.BlobBytes = DefaultBlobBytes
	}
	if opt.BlobAge <= 0 {
		opt.BlobAge = DefaultBlobAge
	}
	if opt.RecordAge <= 0 {
		opt.RecordAge = 30 * 24 * time.Hour
	}
	for _, t := range append([]string{opt.Tenant}, opt.Tenants...) {
		if t == "" {
			continue
		}
		if err := CheckTenantName(t); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	if opt.Setup && opt.Tenant != "" {
		return nil, fmt.Errorf("fleet: a host acts for every tenant, not for %q: %w", opt.Tenant, sandbox.ErrInvalid)
	}
	if opt.InboxPrefix == "" && opt.Tenant != "" {
		opt.InboxPrefix = "_INBOX_" + opt.Tenant
	}
	nopts := []nats.Option{
		nats.Name(opt.Name), nats.Timeout(opt.CallTimeout),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(false),
		// A server that stops answering without closing the connection (a
		// stopped process, a partition) is found by pings: with the
		// client's default (every 2 minutes, 2 unanswered) a host bound
		// to one waited minutes before it tried another server, every
		// call timing out meanwhile.
		nats.PingInterval(opt.CallTimeout), nats.MaxPingsOutstanding(2),
	}
	if opt.InboxPrefix != "" {
		nopts = append(nopts, nats.CustomInboxPrefix(opt.InboxPrefix))
	}
	refused := &denials{}
	nopts = append(nopts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused.add(err) }))
	if opt.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(opt.Creds))
	}
	if opt.TLSCA != "" {
		nopts = append(nopts, nats.RootCAs(opt.TLSCA))
	}
	if opt.TLSCert != "" || opt.TLSKey != "" {
		if opt.TLSCert == "" || opt.TLSKey == "" {
			return nil, fmt.Errorf("fleet: a TLS client certificate needs both --fleet-tls-cert and --fleet-tls-key: %w", sandbox.ErrInvalid)
		}
		nopts = append(nopts, nats.ClientCert(opt.TLSCert, opt.TLSKey))
	}
	nc, err := nats.Connect(strings.Join(opt.URLs, ","), nopts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connect to %s: %w: %w", strings.Join(opt.URLs, ","), ErrUnavailable, err)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(opt.CallTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("fleet: %w", err)
	}
	f := &JetStream{opt: opt, nc: nc, js: js, leader: natsLeader{nc}, tenant: opt.Tenant, views: &views{m: map[string]*JetStream{}}, denials: refused}
	// A cluster that has just started may not have elected its leaders:
	// binding is tried again while it does not answer, until ctx ends;
	// one the servers' permissions refuse is not.
	for began := time.Now(); ; {
		err := f.denied(f.bind(ctx), began)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			nc.Close()
			return nil, err
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			nc.Close()
			return nil, err
		case <-t.C:
		}
	}
}

// Close drains nothing: what was acknowledged is durable.
func (f *JetStream) Close() { f.nc.Close() }

func (f *JetStream) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.opt.CallTimeout)
}

// bind creates or binds the stream and buckets. Every write is synced by
// the servers' own setting (sync_interval: always, docs/fleet.md).
func (f *JetStream) bind(ctx context.Context) error {
	var err error
	if f.opt.Setup {
		err = f.setup(ctx)
	} else {
		err = f.open(ctx)
	}
	if err != nil {
		return fmt.Errorf("fleet: bind the streams and buckets: %w", classify(err))
	}
	return nil
}

func (f *JetStream) setup(ctx context.Context) error {
	c, cancel := f.call(ctx)
	defer cancel()
	if _, err := f.js.CreateOrUpdateStream(c, jetstream.StreamConfig{
		Name: jobsStream, Subjects: []string{jobsSubject, jobsSubject + ".*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
		Replicas: f.opt.Replicas, MaxMsgSize: f.opt.MaxJobBytes,
		Duplicates: 2 * time.Minute, Discard: jetstream.DiscardNew,
	}); err != nil {
		return fmt.Errorf("stream %s: %w", jobsStream, err)
	}
	var err error
	if f.records, err = f.recordStore(c, ""); err != nil {
		return err
	}
	f.marks = f.records
	if f.hosts, err = f.js.CreateOrUpdateKeyValue(c, jetstream.KeyValueConfig{
		Bucket: hostBucket, History: 1, Replicas: f.opt.Replicas, Storage: jetstream.FileStorage,
		MaxValueSize: 16 << 10,
	}); err != nil {
		return fmt.Errorf("bucket %s: %w", hostBucket, err)
	}
	if len(f.opt.Tenants) == 0 {
		if f.blobs, err = f.blobStore(c, ""); err != nil {
			return err
		}
	}
	for _, t := range f.opt.Tenants {
		if _, err := f.recordStore(c, t); err != nil {
			return err
		}
		if _, err := f.blobStore(c, t); err != nil {
			return err
		}
	}
	return nil
}

// recordStore creates (Setup) or binds tenant's bucket of job records.
func (f *JetStream) recordStore(ctx context.Context, tenant string) (jetstream.KeyValue, error) {
	name := recordBucketOf(tenant)
	var kv jetstream.KeyValue
	var err error
	if f.opt.Setup {
		kv, err = f.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: name, History: 1, Replicas: f.opt.Replicas, Storage: jetstream.FileStorage,
			TTL: f.opt.RecordAge, MaxValueSize: 1 << 20,
		})
	} else {
		kv, err = f.js.KeyValue(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", name, err)
	}
	return kv, nil
}

// blobStore creates (Setup) or binds tenant's object store.
func (f *JetStream) blobStore(ctx context.Context, tenant string) (jetstream.ObjectStore, error) {
	name := blobBucketOf(tenant)
	var o jetstream.ObjectStore
	var err error
	if f.opt.Setup {
		size := f.opt.BlobBytes
		if tenant != "" {
			size = f.opt.TenantBlobBytes[tenant]
			if size <= 0 {
				size = f.opt.BlobBytes / int64(max(1, len(f.opt.Tenants)))
			}
		}
		o, err = f.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: name, Replicas: f.opt.Replicas, Storage: jetstream.FileStorage,
			MaxBytes: size, TTL: f.opt.BlobAge,
		})
	} else {
		o, err = f.js.ObjectStore(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", name, err)
	}
	return o, nil
}

// Tenant implements Coordinator. A view shares the connection; the first
// call for a tenant binds (a host: creates) its records and blob store.
func (f *JetStream) Tenant(ctx context.Context, name string) (Coordinator, error) {
	if name != "" {
		if err := CheckTenantName(name); err != nil {
			return nil, err
		}
	} else if f.opt.Setup && len(f.opt.Tenants) > 0 {
		return nil, fmt.Errorf("fleet: this host serves tenants: a job of no tenant has no blob store: %w", sandbox.ErrInvalid)
	}
	if name == f.tenant {
		return f, nil
	}
	f.views.mu.Lock()
	defer f.views.mu.Unlock()
	if v := f.views.m[name]; v != nil {
		return v, nil
	}
	c, cancel := f.call(ctx)
	defer cancel()
	records, err := f.recordStore(c, name)
	if err != nil {
		return nil, fmt.Errorf("fleet: tenant %q: %w", name, classify(err))
	}
	blobs, err := f.blobStore(c, name)
	if err != nil {
		return nil, fmt.Errorf("fleet: tenant %q: %w", name, classify(err))
	}
	v := &JetStream{opt: f.opt, nc: f.nc, js: f.js, leader: f.leader, records: records, marks: f.marks, hosts: f.hosts, tenant: name, blobs: blobs, views: f.views, denials: f.denials}
	f.views.m[name] = v
	return v, nil
}

func (f *JetStream) open(ctx context.Context) error {
	c, cancel := f.call(ctx)
	defer cancel()
	var err error
	if f.records, err = f.recordStore(c, f.tenant); err != nil {
		return err
	}
	if f.tenant == "" {
		f.marks = f.records
	}
	if f.hosts, err = f.js.KeyValue(c, hostBucket); err != nil {
		return fmt.Errorf("bucket %s: %w", hostBucket, err)
	}
	f.blobs, err = f.blobStore(c, f.tenant)
	if f.tenant == "" && errors.Is(err, jetstream.ErrBucketNotFound) {
		// A fleet with tenants: none without one (what fleet status,
		// say, does not need).
		f.blobs, err = nil, nil
	}
	return err
}

// classify wraps a NATS error in the fleet's vocabulary: a timeout or a
// lost connection is ErrUnavailable (the call may have been made).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		return fmt.Errorf("%w: %w", ErrRevision, err)
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrObjectNotFound):
		return fmt.Errorf("%w: %w", sandbox.ErrNotFound, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// No room for a stream or store: a server's "insufficient storage
	// resources available" (10047); a cluster's "no suitable peers for
	// placement, insufficient storage" with every peer online (10005).
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == 10047 ||
		apiErr.ErrorCode == 10005 && strings.Contains(apiErr.Description, "insufficient storage") && !strings.Contains(apiErr.Description, "offline")) {
		return fmt.Errorf("%w: %w", ErrNoRoom, err)
	}
	// 503s, and a cluster still forming or short of peers (10005 "no
	// suitable peers for placement", 10008 "JetStream cluster not
	// available"), answer again later.
	if errors.As(err, &apiErr) && (apiErr.Code == 503 || apiErr.ErrorCode == 10005 || apiErr.ErrorCode == 10008) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

func recordKey(id string) string { return "job." + keyOf(id) }

func decodeRecord(e jetstream.KeyValueEntry) (Record, error) {
	return decodeRecordAt(e.Key(), e.Value(), e.Revision())
}

// decodeRecordAt decodes the record stored under key at revision rev.
func decodeRecordAt(key string, value []byte, rev uint64) (Record, error) {
	var r Record
	if err := json.Unmarshal(value, &r); err != nil || r.Schema != RecordSchema {
		return Record{}, fmt.Errorf("fleet record %s (revision %d) is not a %s record: %v", key, rev, RecordSchema, err)
	}
	r.Revision = rev
	return r, nil
}

// Submit implements Coordinator.
func (f *JetStream) Submit(ctx context.Context, job sandbox.Job) (Record, error) {
	canon, err := f.checkJob(job)
	if err != nil {
		return Record{}, err
	}
	began := time.Now()
	rec, made, err := f.bindJob(ctx, job, Record{Schema: RecordSchema, ID: job.ID, Digest: job.Digest, State: StateQueued, SubmittedAt: time.Now().UTC()})
	if err != nil || rec.State != StateQueued {
		return rec, f.denied(err, began) // or a host has it: nothing to queue
	}
	// Queued (again, if an earlier submitter stopped between the bind
	// and this publish): the stream drops a duplicate of the same id and
	// digest within its window, and a host drops one of a claimed job.
	c, cancel := f.call(ctx)
	defer cancel()
	// Without tenants, the stream drops a second message of the id and
	// digest within its window. The window is the stream's, whoever
	// published, and the publisher names the message id: with tenants,
	// one tenant could stop another's job from being queued by sending
	// its id first. A tenant's message has no id; a second one is
	// dropped by the host that finds the job claimed or ended.
	var opts []jetstream.PublishOpt
	if f.tenant == "" {
		opts = append(opts, jetstream.WithMsgID(job.ID+"/"+job.Digest))
	}
	msg := &nats.Msg{Subject: jobsSubjectOf(f.tenant), Data: canon}
	if made {
		// The record this call made: a host claims it at its revision
		// with no read first (Delivery.Bound).
		msg.Header = nats.Header{}
		msg.Header.Set(headerBoundRevision, strconv.FormatUint(rec.Revision, 10))
		msg.Header.Set(headerBoundAt, rec.SubmittedAt.Format(time.RFC3339Nano))
	}
	if _, err := f.js.PublishMsg(c, msg, opts...); err != nil {
		return rec, f.denied(fmt.Errorf("fleet: queue job %s: %w", job.ID, classify(err)), began)
	}
	return rec, nil
}

// Claim implements Coordinator.
func (f *JetStream) Claim(ctx context.Context, job sandbox.Job, host string) (Record, bool, error) {
	if err := CheckHostName(host); err != nil {
		return Record{}, false, err
	}
	if _, err := f.checkJob(job); err != nil {
		return Record{}, false, err
	}
	now := time.Now().UTC()
	return f.bindJob(ctx, job, Record{Schema: RecordSchema, ID: job.ID, Digest: job.Digest, State: StateClaimed, SubmittedAt: now,
		Host: host, ClaimedAt: now, WallTime: job.Limits.WallTime()})
}

// checkJob returns a job's canonical form if the fleet takes it.
func (f *JetStream) checkJob(job sandbox.Job) ([]byte, error) {
	if err := job.VerifyDigest(); err != nil {
		return nil, err
	}
	canon, err := job.CanonicalJSON()
	if err != nil {
		return nil, err
	}
	if len(canon) > int(f.opt.MaxJobBytes) {
		return nil, fmt.Errorf("job %s is %d bytes, more than the fleet's %d: %w", job.ID, len(canon), f.opt.MaxJobBytes, sandbox.ErrTooLarge)
	}
	return canon, nil
}

// bindJob creates the job's record as rec (made), or finds it bound: the same
// digest answers the record as it is, another is sandbox.ErrConflict.
func (f *JetStream) bindJob(ctx context.Context, job sandbox.Job, rec Record) (Record, bool, error) {
	v, err := json.Marshal(rec)
	if err != nil {
		return Record{}, false, err
	}
	c, cancel := f.call(ctx)
	defer cancel()
	rev, err := f.records.Create(c, recordKey(job.ID), v)
	switch {
	case err == nil:
		rec.Revision = rev
		return rec, true, nil
	case !errors.Is(err, jetstream.ErrKeyExists):
		return Record{}, false, fmt.Errorf("fleet: bind job %s: %w", job.ID, classify(err))
	}
	if rec, err = f.Record(ctx, job.ID); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			// Bound and not there: a server that is not current
			// answered one of the two (an election, a lost quorum).
			return Record{}, false, fmt.Errorf("fleet: bind job %s: %w: the job is bound but its record cannot be read: %w", job.ID, ErrUnavailable, err)
		}
		return Record{}, false, err
	}
	if rec.Digest != job.Digest {
		return rec, false, fmt.Errorf("job %s is already bound to digest %s in the fleet, not %s: %w", job.ID, rec.Digest, job.Digest, sandbox.ErrConflict)
	}
	return rec, false, nil
}

// Record implements Coordinator. The record is read from its stream's
// leader, by a get that is not direct: a direct get is answered by any
// replica that counts itself current, and one back from a pause answers
// before it has caught up (TestFleetRecordsAreTheLeaders: a submitter's
// read right after its submit, "not found"). While the stream, or the
// cluster's metadata, has no leader the read fails as unavailable, rather
// than give an older record. (A leader cut off from its peers answers
// until it steps down, within seconds, to the clients on its side.)
//
// A user whose permissions predate this read (no STREAM.MSG.GET on the
// records' stream: docs/fleet.md) is refused it, after the call's
// timeout; its reads are then direct gets, as they were, from that view.
// Only a refusal of that very get does this: another violation on the
// connection meanwhile is reported as it is.
func (f *JetStream) Record(ctx context.Context, id string) (Record, error) {
	if f.leaderReadDenied.Load() {
		return f.directRecord(ctx, id)
	}
	c, cancel := f.call(ctx)
	defer cancel()
	began := time.Now()
	bucket, key := f.records.Bucket(), recordKey(id)
	m, err := f.leaderLast(c, "KV_"+bucket, "$KV."+bucket+"."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.removed()) {
		return Record{}, fmt.Errorf("fleet: job %s: %w", id, sandbox.ErrNotFound)
	}
	if err != nil {
		err = f.denied(classify(err), began)
		if errors.Is(err, ErrDenied) && strings.Contains(err.Error(), `"$JS.API.STREAM.MSG.GET.KV_`+bucket+`"`) {
			f.leaderReadDenied.Store(true)
			return f.directRecord(ctx, id)
		}
		return Record{}, fmt.Errorf("fleet: job %s: %w", id, err)
	}
	return decodeRecordAt(key, m.data, m.seq)
}

// directRecord reads a job's record by a direct get, which any replica
// answers: what Watch polls with (its watcher's values decide, so an older
// record only delays it), and what a view refused the leader's read uses.
func (f *JetStream) directRecord(ctx context.Context, id string) (Record, error) {
	c, cancel := f.call(ctx)
	defer cancel()
	e, err := f.records.Get(c, recordKey(id))
	if err != nil {
		return Record{}, fmt.Errorf("fleet: job %s: %w", id, classify(err))
	}
	return decodeRecord(e)
}

// Watch implements Coordinator. A watcher hands over the record as it is
// when the watcher starts and each time it is written, and the record is
// also read every second: a watcher alone stops without a word when its
// stream's leader moves or the connection is lost, and its restart can
// block as long as the election takes. done is asked about what the
// watcher hands over, not about a read made on its word: a direct get
// answered by a replica that had not applied the write yet gave the record
// before it (a receipt written, the read after the watcher's word without
// it: the wait took a second more).
//
// Its reads are direct gets: a read each second per waiter would otherwise
// all go to the leaders, through every server's API queue.
func (f *JetStream) Watch(ctx context.Context, id string, done func(Record) bool) (Record, error) {
	return f.watch(ctx, id, done, f.directRecord)
}

// watch is Watch with its reads made by read.
func (f *JetStream) watch(ctx context.Context, id string, done func(Record) bool, read func(context.Context, string) (Record, error)) (Record, error) {
	wctx, cancel := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer watching.Wait()
	defer cancel()
	watched := make(chan Record)
	watching.Go(func() { f.watchRecord(wctx, id, watched) })
	reading := true
	for {
		if reading {
			rec, err := read(ctx, id)
			switch {
			case err == nil && done(rec):
				return rec, nil
			case err == nil, errors.Is(err, sandbox.ErrNotFound), errors.Is(err, ErrUnavailable):
				// Not yet, not there yet (a submit under way), or no
				// answer: asked again.
			default:
				return Record{}, err
			}
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return Record{}, ctx.Err()
		case rec := <-watched:
			t.Stop()
			if done(rec) {
				return rec, nil
			}
			reading = false
		case <-t.C:
			reading = true
		}
	}
}

// watchRecord sends the job's record to out as it is when a watcher
// starts and each time it is written, until ctx ends, starting a new
// watcher whenever one stops.
func (f *JetStream) watchRecord(ctx context.Context, id string, out chan<- Record) {
	for ctx.Err() == nil {
		// Not UpdatesOnly: a write made before the watcher began (and
		// after Watch's last read) comes as its first value.
		w, err := f.records.Watch(ctx, recordKey(id))
		if err == nil {
			for e := range w.Updates() {
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue // the end of the values there at the start; a record aged out
				}
				rec, err := decodeRecord(e)
				if err != nil {
					continue // Watch's reads return it
				}
				select {
				case out <- rec:
				case <-ctx.Done():
				}
			}
			w.Stop()
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// Update implements Coordinator.
func (f *JetStream) Update(ctx context.Context, rec Record) (Record, error) {
	rec.Schema = RecordSchema
	v, err := json.Marshal(rec)
	if err != nil {
		return Record{}, err
	}
	c, cancel := f.call(ctx)
	defer cancel()
	rev, err := f.records.Update(c, recordKey(rec.ID), v, rec.Revision)
	if err != nil {
		return Record{}, fmt.Errorf("fleet: update job %s at revision %d: %w", rec.ID, rec.Revision, classify(err))
	}
	rec.Revision = rev
	return rec, nil
}

// Next implements Coordinator.
func (f *JetStream) Next(ctx context.Context, wait time.Duration) (*Delivery, error) {
	if f.cons == nil {
		c, cancel := f.call(ctx)
		cons, err := f.js.CreateOrUpdateConsumer(c, jobsStream, jetstream.ConsumerConfig{
			Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: f.opt.AckWait, MaxDeliver: -1, MaxAckPending: 100000,
			Replicas: f.opt.Replicas,
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("fleet: consumer %s: %w", consumerName, classify(err))
		}
		f.cons = cons
	}
	batch, err := f.cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		return nil, fmt.Errorf("fleet: fetch a job: %w", classify(err))
	}
	for m := range batch.Messages() {
		return f.delivery(m), nil
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("fleet: fetch a job: %w", classify(err))
	}
	return nil, ErrNoMessage
}

func (f *JetStream) delivery(m jetstream.Msg) *Delivery {
	var delivered, seq uint64
	var queued time.Time
	if md, err := m.Metadata(); err == nil {
		delivered, queued, seq = md.NumDelivered, md.Timestamp, md.Sequence.Stream
	}
	msg := jsMsg{m: m, timeout: f.opt.CallTimeout}
	tenant, err := tenantOfSubject(m.Subject())
	switch {
	case err != nil:
		return &Delivery{Delivered: delivered, Queued: queued, Seq: seq, msg: msg, Err: err}
	case len(m.Data()) > int(f.opt.MaxJobBytes):
		return &Delivery{Delivered: delivered, Queued: queued, Seq: seq, msg: msg, Tenant: tenant,
			Err: fmt.Errorf("a job message of %d bytes is over the fleet's %d: %w", len(m.Data()), f.opt.MaxJobBytes, sandbox.ErrTooLarge)}
	}
	d := NewDelivery(m.Data(), delivered, msg)
	d.Tenant, d.Queued, d.Seq = tenant, queued, seq
	if d.Err == nil {
		d.Bound = boundOf(m.Headers(), d.Job)
	}
	return d
}

// The headers of a job message whose submitter made its record just
// before: the record's revision, and its submission time.
const (
	headerBoundRevision = "Sandboxd-Record-Revision"
	headerBoundAt       = "Sandboxd-Submitted-At"
)

// boundOf is the queued record a job message's headers say its submitter
// made for job, or nil if they do not say so in full.
func boundOf(h nats.Header, job sandbox.Job) *Record {
	rev, err := strconv.ParseUint(h.Get(headerBoundRevision), 10, 64)
	if err != nil || rev == 0 {
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, h.Get(headerBoundAt))
	if err != nil {
		return nil
	}
	return &Record{Schema: RecordSchema, ID: job.ID, Digest: job.Digest, State: StateQueued, SubmittedAt: at.UTC(), Revision: rev}
}

type jsMsg struct {
	m       jetstream.Msg
	timeout time.Duration
}

var _ Message = jsMsg{}

func (j jsMsg) Ack(ctx context.Context) error {
	c, cancel := context.WithTimeout(ctx, j.timeout)
	defer cancel()
	return classify(j.m.DoubleAck(c))
}
func (j jsMsg) Later(d time.Duration) error { return classify(j.m.NakWithDelay(d)) }
func (j jsMsg) Working() error              { return classify(j.m.InProgress()) }
func (j jsMsg) Refuse() error               { return classify(j.m.Term()) }

// heldKey is the mark that host holds id's claim: held.<host>.<id> in
// the fleet without tenants, held.<host>.<tenant>.<id> in a tenant's.
func (f *JetStream) heldKey(host, id string) string {
	if f.tenant == "" {
		return "held." + host + "." + keyOf(id)
	}
	return "held." + host + "." + f.tenant + "." + keyOf(id)
}

// Hold implements Coordinator.
func (f *JetStream) Hold(ctx context.Context, host, id string) error {
	if err := CheckHostName(host); err != nil {
		return err // a wildcard would be another host's marks
	}
	c, cancel := f.call(ctx)
	defer cancel()
	if f.marks == nil {
		return errNoMarks
	}
	_, err := f.marks.Put(c, f.heldKey(host, id), []byte(id))
	return classify(err)
}

// Release implements Coordinator.
func (f *JetStream) Release(ctx context.Context, host, id string) error {
	if err := CheckHostName(host); err != nil {
		return err // a wildcard would be another host's marks
	}
	c, cancel := f.call(ctx)
	defer cancel()
	if f.marks == nil {
		return errNoMarks
	}
	// Purged from the stream, not deleted: a deleted key keeps a marker,
	// which Held's listing would have to read to leave out.
	s, err := f.js.Stream(c, "KV_"+f.marks.Bucket())
	if err == nil {
		err = s.Purge(c, jetstream.WithPurgeSubject("$KV."+f.marks.Bucket()+"."+f.heldKey(host, id)))
	}
	return classify(err)
}

// Held implements Coordinator.
func (f *JetStream) Held(ctx context.Context, host string) ([]Claim, error) {
	if err := CheckHostName(host); err != nil {
		return nil, err // a wildcard would list other hosts' marks
	}
	c, cancel := context.WithTimeout(ctx, 4*f.opt.CallTimeout)
	defer cancel()
	if f.marks == nil {
		return nil, errNoMarks
	}
	prefix := "held." + host + "."
	marks, err := f.leaderEntries(c, f.marks, prefix+">")
	if err != nil {
		return nil, fmt.Errorf("fleet: list the jobs %s holds: %w", host, classify(err))
	}
	var held []Claim
	for k := range marks {
		rest := strings.TrimPrefix(k, prefix)
		if tenant, key, ok := strings.Cut(rest, "."); ok {
			held = append(held, Claim{Tenant: tenant, ID: idOfKey(key)})
		} else {
			held = append(held, Claim{ID: idOfKey(rest)})
		}
	}
	slices.SortFunc(held, func(a, b Claim) int { return strings.Compare(a.Tenant+"/"+a.ID, b.Tenant+"/"+b.ID) })
	return held, nil
}

// leaderEntries are kv's keys matching filter (a key pattern) and their
// values, as the leader of kv's stream holds them; deleted and purged
// keys are left out. What a host lists must include every write it saw
// acknowledged, and only the leader is sure to have applied those: a KV
// listing is an ephemeral consumer, which the servers place on any
// replica, and a KV get is a direct get, which any replica that counts
// itself current answers; either may come from a replica still catching
// up (TestFleetListingsAreTheLeaders). So the keys are the stream's
// subjects under the filter, as its info says them (answered by its
// leader; by a follower only while there is no leader, and then naming
// none: refused here), and each value is the last message of its subject
// by a get that is not direct (the leader's alone). The subjects come
// from the stream's index, and each get is one key's: neither walks the
// records the bucket also holds, nor chases keys rewritten meanwhile. It
// costs a request per key: it is for the few claims a host holds, and
// the hosts.
func (f *JetStream) leaderEntries(ctx context.Context, kv jetstream.KeyValue, filter string) (map[string][]byte, error) {
	name, prefix := "KV_"+kv.Bucket(), "$KV."+kv.Bucket()+"."
	s, err := f.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+filter))
	if err != nil {
		return nil, err
	}
	if info.Cluster != nil && info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s has no leader (a follower answered): %w", name, ErrUnavailable)
	}
	out := make(map[string][]byte, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		m, err := f.leaderLast(ctx, name, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // gone since listed
		}
		if err != nil {
			return nil, err
		}
		if m.removed() {
			continue
		}
		out[strings.TrimPrefix(subject, prefix)] = m.data
	}
	return out, nil
}

// storedMsg is a message of a stream as its leader has it.
type storedMsg struct {
	hdr  nats.Header
	data []byte
	seq  uint64
}

// removed says whether the key was deleted or purged (or aged out, with a
// marker), not written.
func (m storedMsg) removed() bool {
	op := m.hdr.Get("KV-Operation")
	return op == "DEL" || op == "PURGE" || m.hdr.Get(jetstream.MarkerReasonHeader) != ""
}

// msgGet asks for one message of a stream: the last on a subject
// (LastBySubject), or the first on a subject at or after a sequence
// (NextBySubject, Seq).
type msgGet struct {
	LastBySubject string `json:"last_by_subj,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
	Seq           uint64 `json:"seq,omitempty"`
}

func (g msgGet) subject() string { return g.LastBySubject + g.NextBySubject }

// msgGets get one message of a stream.
type msgGets interface {
	get(ctx context.Context, stream string, g msgGet) (storedMsg, error)
}

// natsLeader makes the gets only a stream's leader answers
// ($JS.API.STREAM.MSG.GET, which the jetstream package makes a direct get
// when the stream allows those, as its buckets and object stores do). A
// stream without a leader answers "cluster not available" (unavailable).
type natsLeader struct{ nc *nats.Conn }

func (l natsLeader) get(ctx context.Context, stream string, g msgGet) (storedMsg, error) {
	body, err := json.Marshal(g)
	if err != nil {
		return storedMsg{}, err
	}
	m, err := l.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return storedMsg{}, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject  string `json:"subject"`
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs"`
			Data     []byte `json:"data"`
		} `json:"message"`
	}
	subject := g.subject()
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return storedMsg{}, fmt.Errorf("the answer to a get of %s in %s: %w", subject, stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return storedMsg{}, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return storedMsg{}, resp.Error
	case resp.Message == nil || resp.Message.Subject != subject || resp.Message.Sequence == 0 || resp.Message.Sequence < g.Seq:
		return storedMsg{}, fmt.Errorf("the answer to a get of %s in %s is not a message of it", subject, stream)
	}
	out := storedMsg{hdr: nats.Header{}, data: resp.Message.Data, seq: resp.Message.Sequence}
	if len(resp.Message.Header) > 0 {
		if out.hdr, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return storedMsg{}, fmt.Errorf("the headers of %s in %s: %w", subject, stream, err)
		}
	}
	return out, nil
}

// natsDirect makes direct gets ($JS.API.DIRECT.GET.<stream>), which any
// replica answers once it has applied most of the stream (about 90 %, and
// it goes on answering however far it falls behind after), with the
// message as it is stored (no JSON around it). A replica applies the
// stream in order, so what it has not applied yet it answers "not found",
// and what it gives is the leader's. One exception: each server ages
// messages out on its own clock, so a replica may have dropped a chunk at
// the blob age that the leader still has; a get of "the next chunk" there
// gives the one after it, and the read fails on the bytes' count or hash,
// as it does on the leader a moment later.
type natsDirect struct{ nc *nats.Conn }

func (d natsDirect) get(ctx context.Context, stream string, g msgGet) (storedMsg, error) {
	if g.NextBySubject == "" || g.LastBySubject != "" {
		return storedMsg{}, fmt.Errorf("a direct get here is of the next message on a subject")
	}
	body, err := json.Marshal(msgGet{NextBySubject: g.NextBySubject, Seq: max(1, g.Seq)})
	if err != nil {
		return storedMsg{}, err
	}
	m, err := d.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, body)
	if err != nil {
		return storedMsg{}, err
	}
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		if m.Header.Get("Status") == "404" {
			return storedMsg{}, jetstream.ErrMsgNotFound
		}
		return storedMsg{}, fmt.Errorf("a direct get of %s in %s: %s %s", g.NextBySubject, stream, m.Header.Get("Status"), m.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || m.Header.Get(jetstream.StreamHeader) != stream || m.Header.Get(jetstream.SubjectHeader) != g.NextBySubject || seq < g.Seq {
		return storedMsg{}, fmt.Errorf("the answer to a direct get of %s in %s is not a message of it", g.NextBySubject, stream)
	}
	return storedMsg{hdr: m.Header, data: m.Data, seq: seq}, nil
}

// leaderLast is the last message on subject in stream, from the stream's
// leader.
func (f *JetStream) leaderLast(ctx context.Context, stream, subject string) (storedMsg, error) {
	return f.leader.get(ctx, stream, msgGet{LastBySubject: subject})
}

// errNoMarks: a tenant's submitter does not see the hosts' held marks.
var errNoMarks = fmt.Errorf("fleet: held marks are the hosts' (a tenant's submitter has none): %w", sandbox.ErrInvalid)

// errNoBlobStore: a host's fleet has tenants, and blobs are a tenant's.
var errNoBlobStore = fmt.Errorf("fleet: the fleet has tenants: a blob is in a tenant's store (Tenant): %w", sandbox.ErrInvalid)

// PutBlob implements Coordinator. A blob its store's leader already has
// (blobInfo) is not put again.
func (f *JetStream) PutBlob(ctx context.Context, digest string, size int64, r io.Reader) error {
	if !sandbox.ValidDigest(digest) {
		return fmt.Errorf("blob digest %q: %w", digest, sandbox.ErrInvalid)
	}
	if digest == EmptyDigest {
		// Never stored (Blob serves it): only checked.
		if n, _ := io.ReadFull(r, make([]byte, 1)); n != 0 || size != 0 {
			return fmt.Errorf("fleet: blob %s is empty; %d bytes were sent: %w", digest, max(size, int64(n)), sandbox.ErrInvalid)
		}
		return nil
	}
	if f.blobs == nil {
		return errNoBlobStore
	}
	c, cancel := f.call(ctx)
	info, err := f.blobInfo(c, digest)
	whole := false
	if err == nil && info.Size == uint64(size) {
		whole, err = f.chunksThere(c, info)
	}
	cancel()
	if whole {
		return nil // there already
	}
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("fleet: blob %s: %w", digest, classify(err))
	}
	// A put moves every chunk under its own acknowledgement; its bound
	// grows with the size (at least 1 MiB/s).
	bound := f.opt.CallTimeout + time.Duration(size/(1<<20))*time.Second
	c, cancel = context.WithTimeout(ctx, bound)
	defer cancel()
	h := sha256.New()
	put, err := f.blobs.Put(c, jetstream.ObjectMeta{Name: digest}, io.TeeReader(r, h))
	if err != nil {
		return fmt.Errorf("fleet: put blob %s: %w", digest, classify(err))
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest || put.Size != uint64(size) {
		c, cancel := f.call(ctx)
		defer cancel()
		_ = f.blobs.Delete(c, digest)
		return fmt.Errorf("fleet: blob %s: the bytes sent hash to %s (%d bytes, %d expected): %w", digest, got, put.Size, size, sandbox.ErrInvalid)
	}
	return nil
}

// Blob implements Coordinator. A blob is read as its store's leader has
// it: the metadata by the leader's get (as Record reads a record), each
// chunk the metadata names by a direct get, from the leader where the
// replica that answers does not have it yet (chunkReader). The object
// store's own read takes the metadata from any replica and the chunks
// through a consumer that can sit on any replica: one that had not applied
// the put yet answered "not found" (a host judging a job another host ran,
// right after the job's record named its outputs), or gave the first chunk
// alone (TestFleetBlobsAreTheLeaders: 1 to 4 of 40 reads, each a corrupt
// object). A user refused the direct gets (permissions from before them:
// docs/fleet.md) reads every chunk from the leader, after one call's
// timeout.
func (f *JetStream) Blob(ctx context.Context, digest string) (io.ReadCloser, error) {
	if !sandbox.ValidDigest(digest) {
		return nil, fmt.Errorf("blob digest %q: %w", digest, sandbox.ErrInvalid)
	}
	if digest == EmptyDigest {
		// Never stored (PutBlob): served without a read, and checked at
		// EOF like any other.
		return &checkedReader{r: strings.NewReader(""), h: sha256.New(), want: digest, done: func() {}}, nil
	}
	if f.blobs == nil {
		return nil, errNoBlobStore
	}
	c, cancel := f.call(ctx)
	info, err := f.blobInfo(c, digest)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("fleet: blob %s: %w", digest, classify(err))
	}
	// At least 1 MiB/s, and a replica's get that is never answered.
	bound := f.opt.CallTimeout + time.Duration(info.Size/(1<<20))*time.Second
	bucket := blobBucketOf(f.tenant)
	chunks := &chunkReader{leader: f.leader, callTimeout: f.opt.CallTimeout, stream: "OBJ_" + bucket, subject: "$O." + bucket + ".C." + info.NUID, left: info.Size}
	if !f.directDenied.Load() {
		bound += f.opt.CallTimeout
		chunks.replica = natsDirect{f.nc}
		chunks.replicaFailed = func(err error, began time.Time) {
			// Only a refusal of this very get: another violation on the
			// connection meanwhile is not this view's permissions.
			if err := f.denied(classify(err), began); errors.Is(err, ErrDenied) && strings.Contains(err.Error(), `"$JS.API.DIRECT.GET.OBJ_`+bucket+`"`) {
				f.directDenied.Store(true)
			}
		}
	}
	chunks.ctx, cancel = context.WithTimeout(ctx, bound)
	return &checkedReader{r: chunks, h: sha256.New(), want: digest, done: cancel}, nil
}

// blobInfo is a blob's metadata as its store's leader has it; a blob it
// lacks, or has as deleted, is jetstream.ErrObjectNotFound.
func (f *JetStream) blobInfo(ctx context.Context, digest string) (jetstream.ObjectInfo, error) {
	bucket := blobBucketOf(f.tenant)
	m, err := f.leaderLast(ctx, "OBJ_"+bucket, "$O."+bucket+".M."+base64.URLEncoding.EncodeToString([]byte(digest)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return jetstream.ObjectInfo{}, jetstream.ErrObjectNotFound
	}
	if err != nil {
		return jetstream.ObjectInfo{}, err
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.data, &info); err != nil {
		return jetstream.ObjectInfo{}, fmt.Errorf("its metadata: %w", err)
	}
	switch {
	case info.Deleted:
		return jetstream.ObjectInfo{}, jetstream.ErrObjectNotFound
	case info.Name != digest || info.NUID == "" || (info.Opts != nil && info.Opts.Link != nil):
		// Never what PutBlob writes.
		return jetstream.ObjectInfo{}, fmt.Errorf("its metadata names %q (object %q) or a link, not the blob itself", info.Name, info.NUID)
	}
	return info, nil
}

// chunksThere says whether the store's leader holds every chunk a blob's
// metadata counts. A put cut short (a chunk's acknowledgement lost in an
// election) can leave its metadata without its chunks; that blob is put
// again rather than taken as there.
func (f *JetStream) chunksThere(ctx context.Context, info jetstream.ObjectInfo) (bool, error) {
	bucket := blobBucketOf(f.tenant)
	subject := "$O." + bucket + ".C." + info.NUID
	s, err := f.js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return false, err
	}
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return false, err
	}
	if si.Cluster != nil && si.Cluster.Leader == "" {
		return false, fmt.Errorf("stream OBJ_%s has no leader (a follower answered): %w", bucket, ErrUnavailable)
	}
	return si.State.Subjects[subject] == uint64(info.Chunks), nil
}

// chunkReader reads a blob's chunks in order: each from any replica (a
// direct get, the message as stored), or from the leader where that
// replica does not have it yet. One get at a time from the leader was a
// round trip per chunk, the chunk wrapped in JSON (46 MB/s here against
// the object store's own read, 175: BenchmarkFleetBlobRead). So it asks
// ahead: once the first chunk gives its sequence and size, it keeps gets in
// flight for the next chunksAhead sequences, each "the first chunk at or
// after". A put's chunks are usually consecutive messages, so each get
// finds its own; where another put's messages came between, the gets that
// asked inside the gap find a chunk already read and are dropped. Each
// chunk is taken only from the get that asked from the sequence right
// after the last chunk read.
type chunkReader struct {
	ctx             context.Context
	replica         msgGets                          // nil: the leader's alone
	callTimeout     time.Duration                    // of each get
	replicaFailed   func(err error, began time.Time) // told of a replica's failure other than "not found"
	noReplica       atomic.Bool                      // the leader's alone from now on
	leader          msgGets
	stream, subject string
	next            uint64 // the next chunk is at this sequence or after
	left            uint64 // bytes the metadata says are still to come
	chunk           uint64 // the first chunk's size (0: none read yet)
	buf             []byte
	ahead           map[uint64]chan chunkAnswer // gets in flight, by the sequence they ask from
}

const chunksAhead = 8

type chunkAnswer struct {
	m   storedMsg
	err error
}

// ask starts a get of the first chunk at or after seq, unless one is in
// flight. Its answer never blocks it: a dropped get ends on its own (or
// with ctx, when the reader is closed).
func (r *chunkReader) ask(seq uint64) {
	if r.ahead == nil {
		r.ahead = map[uint64]chan chunkAnswer{}
	}
	if _, ok := r.ahead[seq]; ok {
		return
	}
	answer := make(chan chunkAnswer, 1)
	r.ahead[seq] = answer
	go func() {
		m, err := r.get(msgGet{NextBySubject: r.subject, Seq: seq})
		answer <- chunkAnswer{m, err}
	}()
}

// get asks a replica first, then the leader if the replica does not have
// it (or fails: a replica that cannot answer is asked no more).
func (r *chunkReader) get(g msgGet) (storedMsg, error) {
	if r.replica != nil && !r.noReplica.Load() {
		ctx, cancel := context.WithTimeout(r.ctx, r.callTimeout)
		began := time.Now()
		m, err := r.replica.get(ctx, r.stream, g)
		cancel()
		if err == nil {
			return m, nil
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) && r.ctx.Err() == nil {
			r.noReplica.Store(true)
			if r.replicaFailed != nil {
				r.replicaFailed(err, began)
			}
		}
	}
	// Each of the leader's gets has a call's time: a leader that is
	// paused or being replaced drops the request unanswered. One that
	// does not answer is asked again (a new leader answers it) until the
	// read's own bound.
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		ctx, cancel := context.WithTimeout(r.ctx, r.callTimeout)
		m, err := r.leader.get(ctx, r.stream, g)
		cancel()
		if !errors.Is(classify(err), ErrUnavailable) || r.ctx.Err() != nil {
			return m, err
		}
		select {
		case <-r.ctx.Done():
			return m, err
		case <-time.After(wait):
		}
	}
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.left == 0 {
			return 0, io.EOF
		}
		n := uint64(1)
		if r.chunk > 0 {
			n = min(chunksAhead, (r.left+r.chunk-1)/r.chunk)
		}
		for i := range n {
			r.ask(r.next + i)
		}
		a := <-r.ahead[r.next]
		delete(r.ahead, r.next)
		if errors.Is(a.err, jetstream.ErrMsgNotFound) {
			return 0, fmt.Errorf("its store has %d bytes fewer than its metadata says (aged out?): %w", r.left, io.ErrUnexpectedEOF)
		}
		if a.err != nil {
			return 0, a.err
		}
		if uint64(len(a.m.data)) > r.left {
			return 0, fmt.Errorf("its store has more bytes than its metadata says")
		}
		for seq := range r.ahead {
			if seq <= a.m.seq {
				delete(r.ahead, seq) // it will find this chunk again
			}
		}
		if r.chunk == 0 {
			r.chunk = uint64(len(a.m.data))
		}
		r.buf, r.next, r.left = a.m.data, a.m.seq+1, r.left-uint64(len(a.m.data))
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// checkedReader fails at EOF unless what it read hashes to want.
type checkedReader struct {
	r    io.Reader
	h    hash.Hash
	want string
	done func()
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	switch {
	case err == io.EOF:
		if got := "sha256:" + hex.EncodeToString(c.h.Sum(nil)); got != c.want {
			return n, fmt.Errorf("fleet: blob %s: its bytes hash to %s", c.want, got)
		}
	case err != nil:
		return n, fmt.Errorf("fleet: read blob %s: %w", c.want, classify(err))
	}
	return n, err
}

func (c *checkedReader) Close() error { c.done(); return nil }

// Heartbeat implements Coordinator.
func (f *JetStream) Heartbeat(ctx context.Context, h Host) error {
	if err := CheckHostName(h.Name); err != nil {
		return err
	}
	h.Schema = HostSchema
	v, err := json.Marshal(h)
	if err != nil {
		return err
	}
	c, cancel := f.call(ctx)
	defer cancel()
	_, err = f.hosts.Put(c, h.Name, v)
	return classify(err)
}

// Hosts implements Coordinator.
func (f *JetStream) Hosts(ctx context.Context) ([]Host, error) {
	c, cancel := context.WithTimeout(ctx, 4*f.opt.CallTimeout)
	defer cancel()
	beats, err := f.leaderEntries(c, f.hosts, ">")
	if err != nil {
		return nil, fmt.Errorf("fleet: list hosts: %w", classify(err))
	}
	var out []Host
	for _, v := range beats {
		var h Host
		if json.Unmarshal(v, &h) == nil && h.Schema == HostSchema {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b Host) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Stats are the queue's figures for operators.
type Stats struct {
	Queued, Pending, Delivered uint64
	StreamLeader               string
	Replicas                   []string
}

// Stats reads the job stream's and its consumer's state.
func (f *JetStream) Stats(ctx context.Context) (Stats, error) {
	c, cancel := f.call(ctx)
	defer cancel()
	s, err := f.js.Stream(c, jobsStream)
	if err != nil {
		return Stats{}, fmt.Errorf("fleet: stream %s: %w", jobsStream, classify(err))
	}
	info, err := s.Info(c)
	if err != nil {
		return Stats{}, fmt.Errorf("fleet: stream %s: %w", jobsStream, classify(err))
	}
	st := Stats{Queued: info.State.Msgs}
	if info.Cluster != nil {
		st.StreamLeader = info.Cluster.Leader
		for _, p := range info.Cluster.Replicas {
			st.Replicas = append(st.Replicas, fmt.Sprintf("%s current=%v", p.Name, p.Current))
		}
	}
	if ci, err := s.Consumer(c, consumerName); err == nil {
		if cinfo, err := ci.Info(c); err == nil {
			st.Pending, st.Delivered = uint64(cinfo.NumAckPending), cinfo.Delivered.Consumer
		}
	}
	return st, nil
}
