package journal

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sandboxd/sandboxd/sandbox"
)

// State is how far a job got, as far as the journal can prove: the
// sandbox.JobState the daemon's API reports.
type State = sandbox.JobState

// The states, in order. Finished and Uncertain are terminal (State.Terminal).
const (
	Accepted   = sandbox.JobAccepted
	Dispatched = sandbox.JobDispatched
	Created    = sandbox.JobCreated
	Started    = sandbox.JobStarted
	Finished   = sandbox.JobFinished
	Uncertain  = sandbox.JobUncertain
)

var order = map[State]int{Accepted: 0, Dispatched: 1, Created: 2, Started: 3, Finished: 4, Uncertain: 4}

// Record is everything the journal knows about one job.
type Record struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
	// Job is the job's canonical JSON, exactly as accepted.
	Job   json.RawMessage `json:"job"`
	State State           `json:"state"`
	// Receipt is the signed receipt envelope, returned byte for byte to
	// every identical submission.
	Receipt     []byte    `json:"receipt"`
	AcceptedAt  time.Time `json:"accepted_at"`
	ContainerID string    `json:"container_id,omitempty"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	// Result is the signed result envelope once the job is terminal.
	Result []byte `json:"result,omitempty"`
	// Status is the result's status once the job is terminal.
	Status          sandbox.Status `json:"status,omitempty"`
	FinishedAt      time.Time      `json:"finished_at,omitzero"`
	CancelRequested bool           `json:"cancel_requested,omitempty"`
	// Seq numbers acceptances 1, 2, … in the order the journal made them
	// (0 in records of a journal from before it was kept): the queue's
	// order after a restart, whatever the clock did.
	Seq uint64 `json:"seq,omitempty"`
	// Tenant is who submitted the job when the daemon separates tenants
	// ("" in records of a daemon without tenants, or of a journal from
	// before they were kept: such a job is an admin's alone).
	Tenant string `json:"tenant,omitempty"`
	// Requeued counts the times a restart proved the job never ran and
	// made it accepted again (NotRun). Its next run may meet a container
	// of its name that an earlier process's engine call left
	// (broker.Hooks.ReclaimName).
	Requeued int `json:"requeued,omitempty"`
}

// DecodeJob returns the record's sealed job.
func (r *Record) DecodeJob() (sandbox.Job, error) { return sandbox.DecodeJob(r.Job) }

// Errors. A conflict wraps sandbox.ErrConflict and a missing job
// sandbox.ErrNotFound, so that callers branch on the public sentinels.
var (
	// ErrTransition marks a transition the state machine does not allow.
	ErrTransition = errors.New("journal: transition not allowed")
)

var (
	bucketJobs = []byte("jobs")
	// bucketBlobTenants holds one key per blob and tenant that may read
	// it: digest, a zero byte, tenant name. Uploads and a job's outputs
	// grant it; it survives restarts as the uploads do.
	bucketBlobTenants = []byte("blob_tenants")
	// bucketTenantBlobs is its index by tenant: tenant name, a zero byte,
	// digest; what one tenant holds is read without reading the others'
	// grants. A journal from before it has it built at Open.
	bucketTenantBlobs = []byte("tenant_blobs")
)

// Journal is a bbolt database of job records.
type Journal struct {
	db *bolt.DB
}

// Open opens (creating if needed) the journal file at path.
func Open(path string) (*Journal, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	if db.NoSync {
		db.Close()
		return nil, errors.New("journal: bbolt NoSync is set; transitions would not be durable")
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketJobs); err != nil {
			return err
		}
		grants, err := tx.CreateBucketIfNotExists(bucketBlobTenants)
		if err != nil {
			return err
		}
		if tx.Bucket(bucketTenantBlobs) != nil {
			return nil
		}
		index, err := tx.CreateBucket(bucketTenantBlobs)
		if err != nil {
			return err
		}
		return grants.ForEach(func(k, _ []byte) error {
			d, tenant, _ := bytes.Cut(k, []byte{0})
			return index.Put(tenantBlobKey(string(tenant), string(d)), []byte{1})
		})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	return &Journal{db: db}, nil
}

// Close closes the database.
func (j *Journal) Close() error { return j.db.Close() }

// Accept records a job as accepted with its receipt, unless its id is
// already taken. For the same digest it returns the existing record and
// existing=true (the caller must answer with that record's receipt); for
// another digest it returns an error wrapping sandbox.ErrConflict and
// changes nothing. canonical must be the job's canonical JSON.
func (j *Journal) Accept(job sandbox.Job, canonical, receipt []byte, at time.Time) (rec Record, existing bool, err error) {
	return j.AcceptAs("", job, canonical, receipt, at)
}

// AcceptAs is Accept of a job tenant submitted: a new record carries the
// tenant; an existing one is returned as it is (its tenant may differ:
// the caller decides what another tenant's job id answers).
func (j *Journal) AcceptAs(tenant string, job sandbox.Job, canonical, receipt []byte, at time.Time) (rec Record, existing bool, err error) {
	if job.ID == "" || !sandbox.ValidDigest(job.Digest) {
		return Record{}, false, fmt.Errorf("journal: accept: %w: job is not sealed", sandbox.ErrInvalid)
	}
	err = j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		if v := b.Get([]byte(job.ID)); v != nil {
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("journal: job %s: %w", job.ID, err)
			}
			if rec.Digest != job.Digest {
				return fmt.Errorf("job %s is bound to %s, not %s: %w", job.ID, rec.Digest, job.Digest, sandbox.ErrConflict)
			}
			existing = true
			return nil
		}
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		rec = Record{ID: job.ID, Digest: job.Digest, Job: bytes.Clone(canonical), State: Accepted, Receipt: bytes.Clone(receipt), AcceptedAt: at.UTC(), Seq: seq, Tenant: tenant}
		return put(b, &rec)
	})
	if err != nil {
		return Record{}, false, err
	}
	return rec, existing, nil
}

// AcceptanceOrder compares two records by when the journal accepted
// them, for slices.SortFunc: by Seq, with records of an older journal
// (no Seq, all accepted before any numbered one) first, by their time.
func AcceptanceOrder(a, b Record) int {
	if a.Seq != 0 || b.Seq != 0 {
		return cmp.Compare(a.Seq, b.Seq)
	}
	return cmp.Or(a.AcceptedAt.Compare(b.AcceptedAt), cmp.Compare(a.ID, b.ID))
}

// Get returns the record of a job, or an error wrapping sandbox.ErrNotFound.
func (j *Journal) Get(id string) (Record, error) {
	var rec Record
	err := j.db.View(func(tx *bolt.Tx) error {
		var err error
		rec, err = get(tx.Bucket(bucketJobs), id)
		return err
	})
	return rec, err
}

// get reads one record inside a transaction.
func get(b *bolt.Bucket, id string) (Record, error) {
	var rec Record
	v := b.Get([]byte(id))
	if v == nil {
		return rec, fmt.Errorf("job %s: %w", id, sandbox.ErrNotFound)
	}
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, fmt.Errorf("journal: job %s: %w", id, err)
	}
	return rec, nil
}

// List returns every record, ordered by job id.
func (j *Journal) List() ([]Record, error) {
	var out []Record
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
			var rec Record
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("journal: job %s: %w", k, err)
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, err
}

// Dispatched records that the job is about to be handed to the broker.
func (j *Journal) Dispatched(id string) (Record, error) {
	return j.update(id, Dispatched, func(r *Record) {})
}

// Created records the job's container id.
func (j *Journal) Created(id, containerID string) (Record, error) {
	if containerID == "" {
		return Record{}, fmt.Errorf("journal: job %s: %w: empty container id", id, sandbox.ErrInvalid)
	}
	return j.update(id, Created, func(r *Record) { r.ContainerID = containerID })
}

// Started records that the job's container started.
func (j *Journal) Started(id string, at time.Time) (Record, error) {
	return j.update(id, Started, func(r *Record) { r.StartedAt = at.UTC() })
}

// Finish records the job's signed result and ends it: Uncertain if status
// is uncertain, Finished otherwise.
func (j *Journal) Finish(id string, status sandbox.Status, resultEnvelope []byte, at time.Time) (Record, error) {
	if !status.Valid() || len(resultEnvelope) == 0 {
		return Record{}, fmt.Errorf("journal: job %s: %w: finish needs a status and a result", id, sandbox.ErrInvalid)
	}
	to := Finished
	if status == sandbox.StatusUncertain {
		to = Uncertain
	}
	return j.update(id, to, func(r *Record) {
		r.Status = status
		r.Result = bytes.Clone(resultEnvelope)
		r.FinishedAt = at.UTC()
	})
}

// RequestCancel marks a job to be cancelled. It returns the record; a
// terminal job is returned unchanged.
func (j *Journal) RequestCancel(id string) (Record, error) {
	var rec Record
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		var err error
		if rec, err = get(b, id); err != nil {
			return err
		}
		if rec.State.Terminal() || rec.CancelRequested {
			return nil
		}
		rec.CancelRequested = true
		return put(b, &rec)
	})
	return rec, err
}

// NotRun returns a dispatched job to accepted, unbound from its container,
// once the broker proved that it never ran (broker.ErrNotRun: its
// container never started, or the helper's stream ends before the
// command's start) and removed that container. It is the one transition
// backwards: the job then runs for the first time, in a new container.
func (j *Journal) NotRun(id string) (Record, error) {
	var rec Record
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		var err error
		if rec, err = get(b, id); err != nil {
			return err
		}
		if rec.State.Terminal() || rec.State == Accepted {
			return fmt.Errorf("job %s: %s to %s (not run): %w", id, rec.State, Accepted, ErrTransition)
		}
		rec.State, rec.ContainerID, rec.StartedAt = Accepted, "", time.Time{}
		rec.Requeued++
		return put(b, &rec)
	})
	if err != nil {
		return Record{}, err
	}
	return rec, nil
}

// update applies a forward transition in one fsynced transaction.
func (j *Journal) update(id string, to State, apply func(*Record)) (Record, error) {
	var rec Record
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		var err error
		if rec, err = get(b, id); err != nil {
			return err
		}
		// Only forward: a job is dispatched once and bound to one container
		// once, so a second dispatch or create can never run it again.
		if rec.State.Terminal() || order[to] <= order[rec.State] {
			return fmt.Errorf("job %s: %s to %s: %w", id, rec.State, to, ErrTransition)
		}
		rec.State = to
		apply(&rec)
		return put(b, &rec)
	})
	if err != nil {
		return Record{}, err
	}
	return rec, nil
}

func put(b *bolt.Bucket, rec *Record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return b.Put([]byte(rec.ID), v)
}

// GrantBlobs records that tenant may read the blobs ds (it uploaded them,
// or a job of its produced them). A grant lasts until the blob leaves the
// store (PruneGrants).
func (j *Journal) GrantBlobs(tenant string, ds ...string) error {
	if tenant == "" || len(ds) == 0 {
		return nil
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		b, index := tx.Bucket(bucketBlobTenants), tx.Bucket(bucketTenantBlobs)
		for _, d := range ds {
			if d == "" {
				continue
			}
			if err := b.Put(blobTenantKey(d, tenant), []byte{1}); err != nil {
				return err
			}
			if err := index.Put(tenantBlobKey(tenant, d), []byte{1}); err != nil {
				return err
			}
		}
		return nil
	})
}

// BlobGranted reports whether tenant may read blob d.
func (j *Journal) BlobGranted(tenant, d string) (bool, error) {
	if tenant == "" {
		return false, nil
	}
	var ok bool
	err := j.db.View(func(tx *bolt.Tx) error {
		ok = tx.Bucket(bucketBlobTenants).Get(blobTenantKey(d, tenant)) != nil
		return nil
	})
	return ok, err
}

func blobTenantKey(d, tenant string) []byte {
	return []byte(d + "\x00" + tenant)
}

func tenantBlobKey(tenant, d string) []byte {
	return []byte(tenant + "\x00" + d)
}

// RemoveFinishedBefore removes the records of the jobs that ended before
// cutoff (retention: their signed envelopes go with them) and returns
// their ids. Records of jobs that have not ended are never removed.
func (j *Journal) RemoveFinishedBefore(cutoff time.Time) ([]string, error) {
	var ids []string
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		var old [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var rec Record
			if err := json.Unmarshal(v, &rec); err != nil {
				return nil // kept: an undecodable record is the operator's to look at
			}
			if rec.State.Terminal() && !rec.FinishedAt.IsZero() && rec.FinishedAt.Before(cutoff) {
				old = append(old, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
			ids = append(ids, string(k))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("journal: retention: %w", err)
	}
	return ids, nil
}

// Len is how many job records the journal holds.
func (j *Journal) Len() (int, error) {
	var n int
	err := j.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketJobs).Stats().KeyN
		return nil
	})
	return n, err
}

// PruneGrants removes the grants of every blob keep refuses (one the
// store no longer holds), and returns how many it removed.
func (j *Journal) PruneGrants(keep func(d string) bool) (int, error) {
	n := 0
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlobTenants)
		var gone [][]byte
		b.ForEach(func(k, _ []byte) error {
			d, _, _ := bytes.Cut(k, []byte{0})
			if !keep(string(d)) {
				gone = append(gone, bytes.Clone(k))
			}
			return nil
		})
		index := tx.Bucket(bucketTenantBlobs)
		for _, k := range gone {
			if err := b.Delete(k); err != nil {
				return err
			}
			d, tenant, _ := bytes.Cut(k, []byte{0})
			if err := index.Delete(tenantBlobKey(string(tenant), string(d))); err != nil {
				return err
			}
		}
		n = len(gone)
		return nil
	})
	return n, err
}

// GrantedBlobs lists the blobs tenant may read (it uploaded them, or a job
// of its produced them).
func (j *Journal) GrantedBlobs(tenant string) ([]string, error) {
	var ds []string
	prefix := append([]byte(tenant), 0)
	err := j.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketTenantBlobs).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			ds = append(ds, string(k[len(prefix):]))
		}
		return nil
	})
	return ds, err
}
