package server

import (
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

// reserveTenantUpload reserves room for an upload of size bytes (-1:
// unknown, the most a blob may be) under the tenant's max_upload_bytes:
// its leased uploads and those arriving. It returns a release func; a
// tenant without that quota (or no tenant) is not counted.
func (s *Server) reserveTenantUpload(t *caller, size int64) (func(), error) {
	if t == nil || t.Quota.MaxUploadBytes == 0 {
		return func() {}, nil
	}
	if size < 0 {
		size = s.cfg.MaxBlobBytes
	}
	ds, err := s.cfg.Journal.GrantedBlobs(t.Name)
	if err != nil {
		return nil, err
	}
	q := &s.uploads
	q.mu.Lock()
	defer q.mu.Unlock()
	var held int64
	for _, d := range ds {
		if s.cfg.Blobs.Leased(d, s.cfg.BlobLeaseTTL) {
			if n, err := s.cfg.Blobs.Size(d); err == nil {
				held += n
			}
		}
	}
	if held+q.byTenant[t.Name]+size > t.Quota.MaxUploadBytes {
		return nil, fmt.Errorf("%w: tenant %q's uploads no accepted job names yet hold %d bytes (%d more arriving); %d more would pass its quota max_upload_bytes %d; submit the jobs that use them, or wait for their leases (%v) to end: %w",
			errQuota, t.Name, held, q.byTenant[t.Name], size, t.Quota.MaxUploadBytes, s.cfg.BlobLeaseTTL, errTenantQuota)
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
