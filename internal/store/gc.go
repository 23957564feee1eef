package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Blob is one blob the store holds, as Sweep sees it.
type Blob struct {
	Digest string
	Size   int64
	// Used is when the blob was last written, uploaded or used (see Touch).
	Used time.Time
}

// Blobs lists every blob the store holds.
func (s *Store) Blobs() ([]Blob, error) {
	dir := filepath.Join(s.dir, "sha256")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	out := make([]Blob, 0, len(ents))
	for _, e := range ents {
		d := "sha256:" + e.Name()
		if !digestRE.MatchString(d) {
			continue // not a blob of ours; never removed
		}
		st, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("blob store: %w", err)
		}
		if !st.Mode().IsRegular() {
			continue
		}
		out = append(out, Blob{Digest: d, Size: st.Size(), Used: st.ModTime()})
	}
	return out, nil
}

// Touch marks blob d as used now: Sweep evicts the least recently used
// first.
func (s *Store) Touch(d string) error {
	p, err := s.Path(d)
	if err != nil {
		return err
	}
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("blob %s: %w", d, ErrNotFound)
		}
		return fmt.Errorf("blob store: %w", err)
	}
	return nil
}

// Lease marks blob d as uploaded now, for a job not yet submitted: Sweep
// keeps it, referenced or not, for the lease's time to live.
func (s *Store) Lease(d string) error {
	m := digestRE.FindStringSubmatch(d)
	if m == nil {
		return fmt.Errorf("malformed digest %q", d)
	}
	dir := filepath.Join(s.dir, "leases")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("blob store: %w", err)
	}
	p := filepath.Join(dir, m[1])
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("blob store: lease: %w", err)
	}
	f.Close()
	now := time.Now()
	return os.Chtimes(p, now, now)
}

// leased reports whether d has a lease younger than ttl.
func (s *Store) leased(d string, ttl time.Duration) bool {
	st, err := os.Stat(filepath.Join(s.dir, "leases", strings.TrimPrefix(d, "sha256:")))
	return err == nil && time.Since(st.ModTime()) < ttl
}

// expireLeases removes the leases older than ttl.
func (s *Store) expireLeases(ttl time.Duration) {
	dir := filepath.Join(s.dir, "leases")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if st, err := e.Info(); err == nil && time.Since(st.ModTime()) >= ttl {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// CleanTemp removes the named temp files a writer left in the temp
// directory (the process that wrote them was killed). Call it only while
// no writer of this store is open, in this process or another: at start,
// with the state locked.
func (s *Store) CleanTemp() (int, error) {
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		return 0, fmt.Errorf("blob store: %w", err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "blob-") {
			if err := os.Remove(filepath.Join(s.tmp, e.Name())); err == nil {
				n++
			}
		}
	}
	return n, nil
}

// SweepPolicy says what Sweep may remove.
type SweepPolicy struct {
	// Referenced reports a blob something durable names (a job's input, a
	// result's log or artifact). Every other blob is an orphan and is
	// removed, unless it is leased, pinned or held (see Hold).
	Referenced func(digest string) bool
	// LeaseTTL is how long an upload's lease keeps it.
	LeaseTTL time.Duration
}

// SweepReport is what a Sweep removed and what the store holds after it.
type SweepReport struct {
	Removed      int   `json:"removed_blobs"`
	RemovedBytes int64 `json:"removed_bytes"`
	Blobs        int   `json:"blobs"`
	Bytes        int64 `json:"bytes"`
}

// Sweep removes the orphan blobs of p.
func (s *Store) Sweep(p SweepPolicy) (SweepReport, error) {
	blobs, err := s.Blobs()
	if err != nil {
		return SweepReport{}, err
	}
	s.expireLeases(p.LeaseTTL)
	var rep SweepReport
	var errs []error
	for _, b := range blobs {
		if p.Referenced(b.Digest) || s.leased(b.Digest, p.LeaseTTL) {
			rep.Blobs++
			rep.Bytes += b.Size
			continue
		}
		if err := s.remove(b.Digest); err != nil {
			errs = append(errs, err)
			rep.Blobs++
			rep.Bytes += b.Size
			continue
		}
		rep.Removed++
		rep.RemovedBytes += b.Size
	}
	if rep.Removed > 0 {
		if err := s.syncBlobDir(); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

func (s *Store) remove(d string) error {
	p, err := s.Path(d)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob store: %w", err)
	}
	return nil
}

// Unlease drops the lease of d (a job that names it was accepted).
func (s *Store) Unlease(d string) {
	if m := digestRE.FindStringSubmatch(d); m != nil {
		os.Remove(filepath.Join(s.dir, "leases", m[1]))
	}
}

// LeasedBytes is the size of the blobs held by a lease younger than ttl:
// uploads no accepted job names yet.
func (s *Store) LeasedBytes(ttl time.Duration) (int64, error) {
	dir := filepath.Join(s.dir, "leases")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("blob store: %w", err)
	}
	var n int64
	for _, e := range ents {
		st, err := e.Info()
		if err != nil || time.Since(st.ModTime()) >= ttl {
			continue
		}
		if sz, err := s.Size("sha256:" + e.Name()); err == nil {
			n += sz
		}
	}
	return n, nil
}
