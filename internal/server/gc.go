package server

import (
	"encoding/base64"
	"encoding/json"
	"regexp"

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

// sweepOrphans removes, at start, the blobs no journal record names and
// no upload lease keeps: the artifacts and logs of a collection a crash
// interrupted (recovery collects them again from the container's log, or
// the job ends uncertain), and uploads no job used within their lease. It
// runs before any job does, so no blob is being written.
func (s *Server) sweepOrphans(recs []journal.Record) {
	if n, err := s.cfg.Blobs.CleanTemp(); err != nil {
		s.log.Error("remove temp files of the blob store", "error", err)
	} else if n > 0 {
		s.log.Info("removed temp files an interrupted write left", "files", n)
	}
	refs := referencedBlobs(recs)
	rep, err := s.cfg.Blobs.Sweep(store.SweepPolicy{Referenced: func(d string) bool { return refs[d] }, LeaseTTL: s.cfg.BlobLeaseTTL})
	if err != nil {
		s.log.Error("remove orphan blobs", "error", err)
	}
	if rep.Removed > 0 {
		s.log.Info("removed orphan blobs", "blobs", rep.Removed, "bytes", rep.RemovedBytes)
	}
}
