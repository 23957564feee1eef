package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// errQuota marks an upload refused because the uploads no accepted job
// names yet already hold the quota.
var errQuota = errors.New("upload quota reached")

// uploadQuota bounds the bytes of uploads no accepted job names yet:
// those held under a lease, and those being uploaded.
type uploadQuota struct {
	mu       sync.Mutex
	inflight int64
	// byTenant are the bytes arriving per tenant (Quota.MaxUploadBytes).
	byTenant map[string]int64
}

// reserveUpload reserves room for an upload of size bytes (-1: unknown)
// and returns how many bytes it may have and a release func.
func (s *Server) reserveUpload(size int64) (int64, func(), error) {
	q := &s.uploads
	q.mu.Lock()
	defer q.mu.Unlock()
	held, err := s.cfg.Blobs.LeasedBytes(s.cfg.BlobLeaseTTL)
	if err != nil {
		return 0, nil, err
	}
	room := s.cfg.MaxUploadBytes - held - q.inflight
	want := size
	if want < 0 {
		want = min(s.cfg.MaxBlobBytes, room)
	}
	if want > room || room <= 0 {
		return 0, nil, s.errQuota(held)
	}
	q.inflight += want
	return want, func() {
		q.mu.Lock()
		q.inflight -= want
		q.mu.Unlock()
	}, nil
}

// leaseStoredIf leases blob d for a job not yet submitted if the store
// holds it and may (the caller may read d; if not, it uploads d, proving
// it holds the bytes), and reports whether it did. The lease keeps d from every sweep for
// its time to live, as an upload's does, so a new one takes d's size of
// the quota and is refused as an upload would be when the room is not
// there (leases of stored blobs had taken the room of other clients'
// uploads unchecked); renewing a lease the quota counts already takes
// nothing more.
func (s *Server) leaseStoredIf(may bool, d string) (bool, error) {
	if !may {
		return false, nil
	}
	q := &s.uploads
	q.mu.Lock()
	defer q.mu.Unlock()
	size, err := s.cfg.Blobs.Size(d)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if size > 0 && !s.cfg.Blobs.Leased(d, s.cfg.BlobLeaseTTL) {
		held, err := s.cfg.Blobs.LeasedBytes(s.cfg.BlobLeaseTTL)
		if err != nil {
			return false, err
		}
		if size > s.cfg.MaxUploadBytes-held-q.inflight {
			return false, fmt.Errorf("a lease of this stored %d-byte blob counts as an upload: %w", size, s.errQuota(held))
		}
	}
	if err := s.cfg.Blobs.Lease(d); err != nil {
		return false, err
	}
	// Found again with no sweep in between (one may have removed d since
	// Size; then it is uploaded, under the lease just taken).
	return s.cfg.Blobs.Keep(d), nil
}

// leaseStoredFor is leaseStoredIf with, for a blob the caller may read,
// its tenant's max_upload_bytes checked first: the lease makes the blob
// one of its uploads no accepted job names yet again, as an upload of it
// would, and the room is held until release (never nil).
func (s *Server) leaseStoredFor(ctx context.Context, may bool, d string) (found bool, release func(), err error) {
	release = func() {}
	if may {
		if release, err = s.reserveTenantLease(tenantOf(ctx), d); err != nil {
			return false, func() {}, err
		}
	}
	found, err = s.leaseStoredIf(may, d)
	return found, release, err
}

// errQuota says that the uploads no accepted job names yet, held bytes
// of them and those arriving, leave no room. Call with q.mu held.
func (s *Server) errQuota(held int64) error {
	return fmt.Errorf("%w: uploads no accepted job names yet hold %d bytes (%d more arriving) of the %d-byte quota (--max-upload-bytes); submit the jobs that use them, or wait for their leases (%v) to end", errQuota, held, s.uploads.inflight, s.cfg.MaxUploadBytes, s.cfg.BlobLeaseTTL)
}

// releaseLeases drops the leases of an accepted job's inputs: the journal
// names them now.
func (s *Server) releaseLeases(job sandbox.Job) {
	for _, in := range job.Inputs {
		s.cfg.Blobs.Unlease(in.Digest)
	}
}

func (s *Server) registerQuota() {
	s.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxd_blob_bytes_leased", Help: "Bytes of uploads no accepted job names yet (counted against --max-upload-bytes)."},
		func() float64 {
			n, _ := s.cfg.Blobs.LeasedBytes(s.cfg.BlobLeaseTTL)
			return float64(n)
		}))
}

// quotaStatus is the HTTP status of an upload the quota refused.
const quotaStatus = http.StatusInsufficientStorage

// tenantHeld is what the tenant holds of the blob store: the bytes of
// the blobs granted to it (its uploads, its jobs' outputs) that the store
// holds, each once (max_blob_bytes), and of them those a lease holds,
// uploads no accepted job names yet (max_upload_bytes). A grant of a blob
// the store no longer holds counts nothing (the next collection drops it).
func (s *Server) tenantHeld(tenant string) (stored, leased int64, err error) {
	ds, err := s.cfg.Journal.GrantedBlobs(tenant)
	if err != nil {
		return 0, 0, err
	}
	for _, d := range ds {
		n, err := s.cfg.Blobs.Size(d)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		stored += n
		if s.cfg.Blobs.Leased(d, s.cfg.BlobLeaseTTL) {
			leased += n
		}
	}
	return stored, leased, nil
}

// reserveTenantUpload reserves room for an upload of size bytes (-1:
// unknown, the most a blob may be) under the tenant's max_upload_bytes
// (its leased uploads and those arriving) and max_blob_bytes (the stored
// blobs it holds and its uploads arriving). It returns a release func; a
// tenant without those quotas (or no tenant) is not counted.
func (s *Server) reserveTenantUpload(t *caller, size int64) (func(), error) {
	if t == nil || t.Quota.MaxUploadBytes == 0 && t.Quota.MaxBlobBytes == 0 {
		return func() {}, nil
	}
	if size < 0 {
		size = s.cfg.MaxBlobBytes
	}
	return s.reserveTenant(t, size, "")
}

// reserveTenantLease reserves room under the tenant's max_upload_bytes for
// a new lease of blob d, stored and granted to it (an empty PUT of its own
// blob): the lease makes d one of its uploads no accepted job names yet
// again, as an upload of it would. Renewing a lease its quota counts
// already takes nothing; d's bytes are held already (max_blob_bytes).
func (s *Server) reserveTenantLease(t *caller, d string) (func(), error) {
	if t == nil || t.Quota.MaxUploadBytes == 0 || s.cfg.Blobs.Leased(d, s.cfg.BlobLeaseTTL) {
		return func() {}, nil
	}
	size, err := s.cfg.Blobs.Size(d)
	if errors.Is(err, store.ErrNotFound) {
		return func() {}, nil // an upload, then: putBlob reserves it as one
	}
	if err != nil {
		return nil, err
	}
	return s.reserveTenant(t, size, fmt.Sprintf("a lease of this stored %d-byte blob counts as an upload: ", size))
}

// reserveTenantMade reserves room for blob d, stored, made for the
// tenant (a control workspace a plan builds from its bundle) and from now
// one of its uploads no accepted job names yet: under max_upload_bytes
// unless a lease counts it already, and under max_blob_bytes unless the
// tenant holds it already. The blob is to be leased and granted before
// the release.
func (s *Server) reserveTenantMade(t *caller, d string) (func(), error) {
	if t == nil || t.Quota.MaxUploadBytes == 0 && t.Quota.MaxBlobBytes == 0 {
		return func() {}, nil
	}
	granted, err := s.cfg.Journal.BlobGranted(t.Name, d)
	if err != nil {
		return nil, err
	}
	if granted {
		return s.reserveTenantLease(t, d) // held already: at most a new lease
	}
	size, err := s.cfg.Blobs.Size(d)
	if err != nil {
		return nil, err
	}
	return s.reserveTenant(t, size, fmt.Sprintf("a %d-byte control workspace this plan made counts as an upload: ", size))
}

// reserveTenant counts size bytes more as arriving for the tenant's
// quotas (what being, in the error, says what they are), if they leave
// room.
func (s *Server) reserveTenant(t *caller, size int64, being string) (func(), error) {
	q := &s.uploads
	q.mu.Lock()
	defer q.mu.Unlock()
	// Under q.mu: an upload grants its blob before it gives its
	// reservation back, so each is counted once, stored or arriving.
	stored, leased, err := s.tenantHeld(t.Name)
	if err != nil {
		return nil, err
	}
	arriving := q.byTenant[t.Name]
	if max := t.Quota.MaxUploadBytes; max > 0 && leased+arriving+size > max {
		return nil, fmt.Errorf("%s%w: tenant %q's uploads no accepted job names yet hold %d bytes (%d more arriving); %d more would pass its quota max_upload_bytes %d; submit the jobs that use them, or wait for their leases (%v) to end: %w",
			being, errQuota, t.Name, leased, arriving, size, max, s.cfg.BlobLeaseTTL, errTenantQuota)
	}
	if max := t.Quota.MaxBlobBytes; max > 0 && stored+arriving+size > max {
		return nil, fmt.Errorf("%w: tenant %q holds %d bytes of stored blobs, its uploads and its jobs' outputs (%d more arriving); %d more would pass its quota max_blob_bytes %d; %s: %w",
			errQuota, t.Name, stored, arriving, size, max, s.freedBy(), errTenantQuota)
	}
	if q.byTenant == nil {
		q.byTenant = map[string]int64{}
	}
	q.byTenant[t.Name] += size
	return func() {
		q.mu.Lock()
		q.byTenant[t.Name] -= size
		q.mu.Unlock()
	}, nil
}

// freedBy says when a tenant's stored blobs leave the store.
func (s *Server) freedBy() string {
	records := "are kept (no --retain)"
	if s.cfg.Retain > 0 {
		records = fmt.Sprintf("go %v after their job ended (--retain)", s.cfg.Retain)
	}
	return fmt.Sprintf("a blob leaves the store when no job record names it and no lease (%v) holds it, or beyond --blob-budget; records of ended jobs %s", s.cfg.BlobLeaseTTL, records)
}

// checkTenantBlobs refuses a job while its tenant holds its max_blob_bytes
// of stored blobs already: the job's outputs would be more.
func (s *Server) checkTenantBlobs(t *caller) *refusal {
	if t.Quota.MaxBlobBytes == 0 {
		return nil
	}
	stored, _, err := s.tenantHeld(t.Name)
	if err != nil {
		return &refusal{code: http.StatusInternalServerError, err: err}
	}
	if stored >= t.Quota.MaxBlobBytes {
		return &refusal{code: quotaStatus, reason: "tenant_quota",
			err: fmt.Errorf("tenant %q holds %d bytes of stored blobs, its uploads and its jobs' outputs, its quota max_blob_bytes is %d: the job's outputs would be more; %s: %w",
				t.Name, stored, t.Quota.MaxBlobBytes, s.freedBy(), errTenantQuota)}
	}
	return nil
}
