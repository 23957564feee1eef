package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/broker"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// hexDigestRE finds what may be a blob's digest in a job or a result.
var hexDigestRE = regexp.MustCompile(`[0-9a-f]{64}`)

// referencedBlobs returns every blob digest a journal record names: the
// inputs of its job, the logs and artifacts of its result. It reads every
// 64-hex string of the job and of the result's payload, not only the
// fields it knows, and never checks a signature: a blob is kept when in
// doubt (a result signed with a key since replaced still names its
// artifacts).
func referencedBlobs(recs []journal.Record) map[string]bool {
	refs := map[string]bool{}
	add := func(b []byte) {
		for _, m := range hexDigestRE.FindAll(b, -1) {
			refs["sha256:"+string(m)] = true
		}
	}
	for _, r := range recs {
		add(r.Job)
		if len(r.Result) == 0 {
			continue
		}
		var env sandbox.Envelope
		if err := json.Unmarshal(r.Result, &env); err != nil {
			add(r.Result)
			continue
		}
		payload, err := base64.StdEncoding.DecodeString(env.Payload)
		if err != nil {
			add(r.Result)
			continue
		}
		add(payload)
	}
	return refs
}

// jobPins are the blob pins of the jobs accepted and not yet ended: a
// sweep never removes their inputs, nor their input volumes.
type jobPins struct {
	mu sync.Mutex
	m  map[string]func()
}

func (p *jobPins) set(id string, unpin func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]func(){}
	}
	if old := p.m[id]; old != nil {
		old()
	}
	p.m[id] = unpin
}

func (p *jobPins) release(id string) {
	p.mu.Lock()
	unpin := p.m[id]
	delete(p.m, id)
	p.mu.Unlock()
	if unpin != nil {
		unpin()
	}
}

func inputDigests(j sandbox.Job) []string {
	ds := make([]string, 0, len(j.Inputs))
	for _, in := range j.Inputs {
		ds = append(ds, in.Digest)
	}
	return ds
}

// volumeEvicter is the part of *broker.Broker that bounds its input
// volumes.
type volumeEvicter interface {
	EvictInputVolumes(ctx context.Context, budget int64) (broker.VolumeReport, error)
}

// GCReport is what a collection removed and what the caches hold after it.
type GCReport struct {
	Blobs   store.SweepReport    `json:"blobs"`
	Volumes *broker.VolumeReport `json:"volumes,omitempty"`
}

// gcStats are the figures of the last collection, for the metrics.
type gcStats struct {
	mu           sync.Mutex
	blobBytes    int64
	volumeBytes  int64
	evictedBlobs int64 // bytes, cumulative
	evictedVols  int64 // bytes, cumulative
}

// collectGarbage bounds the caches: it removes orphan blobs, then the
// least recently used blobs and input volumes beyond their budgets. What a
// queued or running job needs is pinned and never goes.
func (s *Server) collectGarbage(ctx context.Context) (GCReport, error) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.retire(ctx)
	recs, err := s.cfg.Journal.List()
	if err != nil {
		return GCReport{}, fmt.Errorf("gc: %w", err)
	}
	refs := referencedBlobs(recs)
	var rep GCReport
	var errs []error
	rep.Blobs, err = s.cfg.Blobs.Sweep(store.SweepPolicy{Referenced: func(d string) bool { return refs[d] }, LeaseTTL: s.cfg.BlobLeaseTTL, Budget: s.cfg.BlobBudget, MinAge: s.cfg.GCMinAge})
	if err != nil {
		errs = append(errs, fmt.Errorf("gc blobs: %w", err))
	}
	s.gc.mu.Lock()
	s.gc.blobBytes = rep.Blobs.Bytes
	s.gc.evictedBlobs += rep.Blobs.RemovedBytes + rep.Blobs.EvictedBytes
	s.gc.mu.Unlock()
	// Grants of blobs the store no longer holds go too: a tenant uploads
	// such a blob again to use it.
	if _, err := s.cfg.Journal.PruneGrants(s.cfg.Blobs.Has); err != nil {
		errs = append(errs, fmt.Errorf("gc blob grants: %w", err))
	}
	if v, ok := s.cfg.Broker.(volumeEvicter); ok {
		vr, err := v.EvictInputVolumes(ctx, s.cfg.VolumeBudget)
		if err != nil {
			errs = append(errs, fmt.Errorf("gc volumes: %w", err))
		}
		rep.Volumes = &vr
		s.gc.mu.Lock()
		s.gc.volumeBytes = vr.Bytes
		s.gc.evictedVols += vr.EvictedBytes
		s.gc.mu.Unlock()
	}
	if n := rep.Blobs.Removed + rep.Blobs.Evicted; n > 0 || (rep.Volumes != nil && rep.Volumes.Evicted > 0) {
		s.log.Info("caches collected", "blobs_removed", n, "blob_bytes_freed", rep.Blobs.RemovedBytes+rep.Blobs.EvictedBytes,
			"blob_bytes", rep.Blobs.Bytes, "volumes", rep.Volumes)
	}
	return rep, errors.Join(errs...)
}

// retire removes the journal records of jobs that ended more than Retain
// ago, with their signed envelopes; the blobs only they named are then
// orphans the collection removes (once GCMinAge past their last use). The
// assessments retained more than Retain ago go too: one is made after the
// jobs it judges ended, so none goes before their records.
func (s *Server) retire(ctx context.Context) {
	if s.cfg.Retain <= 0 {
		return
	}
	cutoff := time.Now().Add(-s.cfg.Retain)
	ids, err := s.cfg.Journal.RemoveFinishedBefore(cutoff)
	if err != nil {
		s.log.Error("retention", "error", err)
	} else if len(ids) > 0 {
		s.m.retired.Add(float64(len(ids)))
		s.log.Info("removed the records of jobs ended before the retention", "records", len(ids), "retain", s.cfg.Retain.String())
	}
	if s.cfg.Supervisor == nil {
		return
	}
	n, err := s.cfg.Supervisor.RemoveRetainedBefore(ctx, cutoff)
	if n > 0 {
		s.m.assessmentsRetired.Add(float64(n))
		s.log.Info("removed the assessments retained before the retention", "assessments", n, "retain", s.cfg.Retain.String())
	}
	if err != nil {
		s.log.Error("retention of assessments", "error", err)
	}
}

// gcLoop collects the caches every GCInterval until ctx is done.
func (s *Server) gcLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.GCInterval)
	defer t.Stop()
	for {
		if _, err := s.collectGarbage(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("collect caches", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// gcHandler runs a collection now (`sandboxd gc`) and answers its report.
func (s *Server) gcHandler(w http.ResponseWriter, r *http.Request) {
	rep, err := s.collectGarbage(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Server) registerGC() {
	get := func(f func() int64) func() float64 {
		return func() float64 {
			s.gc.mu.Lock()
			defer s.gc.mu.Unlock()
			return float64(f())
		}
	}
	if s.cfg.Supervisor != nil {
		s.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_assessments_retained", Help: "Assessments and their signed forms retained (removed after --retain)."},
			func() float64 {
				n, _ := s.cfg.Supervisor.Retained(context.Background())
				return float64(n)
			}))
	}
	s.m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_journal_records", Help: "Job records the journal holds (ended ones are removed after --retain)."},
			func() float64 {
				n, _ := s.cfg.Journal.Len()
				return float64(n)
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_blob_store_bytes", Help: "Bytes the blob store held after the last collection (budget: --blob-budget)."},
			get(func() int64 { return s.gc.blobBytes })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_input_volume_bytes", Help: "Bytes of read-only input volumes after the last collection (budget: --volume-budget)."},
			get(func() int64 { return s.gc.volumeBytes })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sandboxd_blob_bytes_removed_total", Help: "Bytes of blobs removed by collections (orphans and evictions)."},
			get(func() int64 { return s.gc.evictedBlobs })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sandboxd_input_volume_bytes_evicted_total", Help: "Bytes of input volumes evicted by collections."},
			get(func() int64 { return s.gc.evictedVols })),
	)
}

// sweepOrphans runs at start, before any job: it pins the inputs of the
// jobs still open, removes the temp files a killed writer left, and
// collects the blob store: the artifacts and logs of a collection a crash
// interrupted (recovery collects them again from the container's log, or
// the job ends uncertain) and uploads no job used within their lease are
// removed.
func (s *Server) sweepOrphans(recs []journal.Record) {
	for _, r := range recs {
		if r.State.Terminal() {
			continue
		}
		if job, err := r.DecodeJob(); err == nil {
			s.pins.set(r.ID, s.cfg.Blobs.Pin(inputDigests(job)...))
		}
	}
	if n, err := s.cfg.Blobs.CleanTemp(); err != nil {
		s.log.Error("remove temp files of the blob store", "error", err)
	} else if n > 0 {
		s.log.Info("removed temp files an interrupted write left", "files", n)
	}
	refs := referencedBlobs(recs)
	rep, err := s.cfg.Blobs.Sweep(store.SweepPolicy{Referenced: func(d string) bool { return refs[d] }, LeaseTTL: s.cfg.BlobLeaseTTL, Budget: s.cfg.BlobBudget})
	if err != nil {
		s.log.Error("remove orphan blobs", "error", err)
	}
	if rep.Removed+rep.Evicted > 0 {
		s.log.Info("removed orphan blobs", "blobs", rep.Removed, "bytes", rep.RemovedBytes, "evicted", rep.Evicted, "evicted_bytes", rep.EvictedBytes)
	}
}
