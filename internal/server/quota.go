package server

import (
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

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
		return 0, nil, fmt.Errorf("%w: uploads no accepted job names yet hold %d bytes (%d more arriving) of the %d-byte quota (--max-upload-bytes); submit the jobs that use them, or wait for their leases (%v) to end", errQuota, held, q.inflight, s.cfg.MaxUploadBytes, s.cfg.BlobLeaseTTL)
	}
	q.inflight += want
	return want, func() {
		q.mu.Lock()
		q.inflight -= want
		q.mu.Unlock()
	}, nil
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
