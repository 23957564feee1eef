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

// leaseStored leases blob d for a job not yet submitted if the store holds
// it, and reports whether it did. The lease keeps d from every sweep for
// its time to live, as an upload's does, so a new one takes d's size of
// the quota and is refused as an upload would be when the room is not
// there (leases of stored blobs had taken the room of other clients'
// uploads unchecked); renewing a lease the quota counts already takes
// nothing more.
func (s *Server) leaseStored(d string) (bool, error) {
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
