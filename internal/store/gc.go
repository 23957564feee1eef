package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Blob is one blob the store holds, as Sweep sees it.
type Blob struct {
	Digest string
	Size   int64
	// Used is when the blob was last written, uploaded or used (see Touch).
	Used time.Time
}

// Blobs lists every blob the store holds as a file of its own (not the
// members of packs: see units).
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
	err = os.Chtimes(p, now, now)
	// A packed blob: its pack is used now (looked up again if it went
	// meanwhile).
	for try := 0; errors.Is(err, fs.ErrNotExist) && try < 2; try++ {
		l, ok := s.findPacked(d)
		if !ok {
			break
		}
		if err = os.Chtimes(s.packPath(l.p.name), now, now); errors.Is(err, fs.ErrNotExist) {
			s.forgetPack(l.p)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", d, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("blob store: %w", err)
	}
	return nil
}

// Lease marks blob d as uploaded now, for a job not yet submitted: Sweep
// keeps it, referenced or not, for the lease's time to live. It reads no
// blob (an upload leases before its bytes are proven): a sweep copies a
// leased packed member out to a file of its own (copyOutLeased), so that a
// lease keeps the bytes it names, never a whole pack.
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

// Leased reports whether d has a lease younger than ttl: LeasedBytes
// counts it already.
func (s *Store) Leased(d string, ttl time.Duration) bool { return s.leased(d, ttl) }

// leased reports whether d has a lease younger than ttl.
func (s *Store) leased(d string, ttl time.Duration) bool {
	st, err := os.Stat(filepath.Join(s.dir, "leases", strings.TrimPrefix(d, "sha256:")))
	return err == nil && time.Since(st.ModTime()) < ttl
}

// copyOutLeased copies the leased members of a pack that have no file of
// their own out to one, before a sweep decides on the pack. One that
// cannot be copied (it does not check: an upload repairs it) keeps its
// pack, as does a lease taken after this (removeIfIdle looks again).
func (s *Store) copyOutLeased(u unit, leases map[string]bool) {
	if u.pack == nil {
		return
	}
	for _, e := range u.pack.members {
		d := keyDigest(e.key)
		if !leases[d] || s.hasLoose(d) {
			continue
		}
		if f, err := s.Open(d); err == nil {
			s.Put(f, d, f.Size())
			f.Close()
		}
	}
}

// leaseSet is the digests with a lease younger than ttl.
func (s *Store) leaseSet(ttl time.Duration) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "leases"))
	for _, e := range ents {
		if st, err := e.Info(); err == nil && time.Since(st.ModTime()) < ttl {
			out["sha256:"+e.Name()] = true
		}
	}
	return out
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

// refs are what a Sweep must not remove: blobs pinned by the jobs that
// need them (queued, running), and holds, each the start of a job whose
// outputs are being written and not yet named by anything durable.
type refs struct {
	mu     sync.Mutex
	pinned map[string]int
	holds  map[int]time.Time
	next   int
	// sweep is held for writing while a blob is removed, and for reading
	// while a writer settles on a copy already in place (and, in a shared
	// store, across processes: share.go).
	sweep sweepLock
}

// sweepHook, if set (by tests), runs at each stage of a sweep's removal of
// d ("locked": it holds the sweep lock; "checked": it found d idle and is
// about to remove it) and of a claim ("waiting": Pin or Keep is about to
// wait for a sweep).
var sweepHook func(stage, d string)

func hook(stage, d string) {
	if sweepHook != nil {
		sweepHook(stage, d)
	}
}

// Keep reports whether the store holds d and, if so, marks it used now,
// with no sweep in between: a blob it finds stays past every sweep that
// spares blobs used since (a lease, a hold, MinAge).
func (s *Store) Keep(d string) bool {
	hook("waiting", d)
	s.refs.sweep.RLock()
	defer s.refs.sweep.RUnlock()
	if !s.Has(d) {
		return false
	}
	s.Touch(d)
	return true
}

// Pin keeps the blobs digests from every Sweep until unpin is called, and
// marks them used now. Pin before checking that a blob is there: a blob
// found after Pin stays (Pin waits for a sweep that is removing one).
func (s *Store) Pin(digests ...string) (unpin func()) {
	r := &s.refs
	hook("waiting", strings.Join(digests, ","))
	r.sweep.RLock()
	defer r.sweep.RUnlock()
	r.mu.Lock()
	if r.pinned == nil {
		r.pinned = map[string]int{}
	}
	for _, d := range digests {
		r.pinned[d]++
	}
	r.mu.Unlock()
	for _, d := range digests {
		s.Touch(d)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, d := range digests {
				if r.pinned[d]--; r.pinned[d] <= 0 {
					delete(r.pinned, d)
				}
			}
		})
	}
}

// Pinned reports whether a job needs d now.
func (s *Store) Pinned(d string) bool {
	s.refs.mu.Lock()
	defer s.refs.mu.Unlock()
	return s.refs.pinned[d] > 0
}

// Hold pins digests and keeps from every Sweep each blob written or
// touched from now on, until release: a job's artifacts and logs are
// stored before its result names them. Every blob a writer puts in place
// has a modification time after the hold began (a new file, or a copy
// already there, touched), so a Sweep spares blobs newer than the oldest
// hold.
func (s *Store) Hold(digests ...string) (release func()) {
	unpin := s.Pin(digests...)
	r := &s.refs
	r.mu.Lock()
	if r.holds == nil {
		r.holds = map[int]time.Time{}
	}
	id := r.next
	r.next++
	// A second of margin for file systems whose timestamps are coarse.
	r.holds[id] = time.Now().Add(-time.Second)
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.holds, id)
			r.mu.Unlock()
			unpin()
		})
	}
}

// cutoff is the start of the oldest hold, or now.
func (r *refs) cutoff() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := time.Now()
	for _, t := range r.holds {
		if t.Before(c) {
			c = t
		}
	}
	return c
}

// SweepPolicy says what Sweep may remove.
type SweepPolicy struct {
	// Referenced reports a blob something durable names (a job's input, a
	// result's log or artifact). Every other blob is an orphan and is
	// removed, unless it is leased, pinned or held.
	Referenced func(digest string) bool
	// LeaseTTL is how long an upload's lease keeps it.
	LeaseTTL time.Duration
	// MinAge spares every blob used more recently: a blob a writer that
	// holds nothing (see Hold) just put in place, for the job it is about
	// to hand it to. Zero at start, when nothing else writes.
	MinAge time.Duration
	// Budget, if positive, is the most bytes the store may hold: beyond
	// it, referenced blobs go too, least recently used first. Pinned,
	// leased and held blobs never go, so the store can stay over it.
	Budget int64
}

// SweepReport is what a Sweep removed and what the store holds after it.
type SweepReport struct {
	Removed      int   `json:"removed_blobs"`
	RemovedBytes int64 `json:"removed_bytes"`
	Evicted      int   `json:"evicted_blobs"`
	EvictedBytes int64 `json:"evicted_bytes"`
	Blobs        int   `json:"blobs"`
	Bytes        int64 `json:"bytes"`
}

// unit is what a sweep removes at once: a blob of its own, or a pack
// with all its members.
type unit struct {
	Blob
	pack *pack // nil for a blob of its own
}

// count is the number of blobs the unit holds.
func (u unit) count() int {
	if u.pack == nil {
		return 1
	}
	return len(u.pack.members)
}

// any reports whether f holds for a blob of the unit.
func (u unit) any(f func(d string) bool) bool {
	if u.pack == nil {
		return f(u.Digest)
	}
	for _, e := range u.pack.members {
		if f(keyDigest(e.key)) {
			return true
		}
	}
	return false
}

// units lists the blobs of their own and the packs the store holds.
func (s *Store) units() ([]unit, error) {
	blobs, err := s.Blobs()
	if err != nil {
		return nil, err
	}
	out := make([]unit, 0, len(blobs))
	for _, b := range blobs {
		out = append(out, unit{Blob: b})
	}
	for _, p := range s.knownPacks() {
		st, err := os.Lstat(s.packPath(p.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("blob store: %w", err)
		}
		out = append(out, unit{Blob: Blob{Digest: "pack " + p.name, Size: st.Size(), Used: st.ModTime()}, pack: p})
	}
	return out, nil
}

// Sweep removes the orphan blobs of p, then, while the store holds more
// than p.Budget, the least recently used blobs nothing needs now. A pack
// goes only when none of its members is referenced, leased, pinned or
// used too recently, and then with all of them.
func (s *Store) Sweep(p SweepPolicy) (SweepReport, error) {
	units, err := s.units()
	if err != nil {
		return SweepReport{}, err
	}
	s.expireLeases(p.LeaseTTL)
	var rep SweepReport
	var errs []error
	var kept []unit
	// A process that began sharing the store after this touches what it
	// finds after this, under the sweep lock: MinAge spares it.
	users := s.usersCutoff()
	leases := s.leaseSet(p.LeaseTTL)
	for _, u := range units {
		s.copyOutLeased(u, leases)
	}
	leased := func(u unit) bool {
		return u.any(func(d string) bool { return leases[d] && (u.pack == nil || !s.hasLoose(d)) })
	}
	for _, u := range units {
		if u.any(p.Referenced) || leased(u) {
			kept = append(kept, u)
			continue
		}
		switch gone, err := s.removeIfIdle(u, p.MinAge, p.LeaseTTL, users); {
		case err != nil:
			errs = append(errs, err)
			kept = append(kept, u)
		case gone:
			rep.Removed += u.count()
			rep.RemovedBytes += u.Size
		default:
			kept = append(kept, u)
		}
	}
	var total int64
	for _, u := range kept {
		total += u.Size
	}
	if p.Budget > 0 && total > p.Budget {
		slices.SortFunc(kept, func(a, b unit) int { return a.Used.Compare(b.Used) })
		rest := kept[:0]
		for _, u := range kept {
			if total <= p.Budget || leased(u) {
				rest = append(rest, u)
				continue
			}
			switch gone, err := s.removeIfIdle(u, p.MinAge, p.LeaseTTL, users); {
			case err != nil:
				errs = append(errs, err)
				rest = append(rest, u)
			case gone:
				rep.Evicted += u.count()
				rep.EvictedBytes += u.Size
				total -= u.Size
			default:
				rest = append(rest, u)
			}
		}
		kept = rest
	}
	for _, u := range kept {
		rep.Blobs += u.count()
	}
	rep.Bytes = total
	if rep.Removed+rep.Evicted > 0 {
		if err := s.syncBlobDir(); err != nil {
			errs = append(errs, err)
		}
		if _, err := os.Lstat(s.packDir()); err == nil {
			if err := syncDir(s.packDir()); err != nil {
				errs = append(errs, fmt.Errorf("blob store: sync directory: %w", err))
			}
		}
	}
	return rep, errors.Join(errs...)
}

// removeIfIdle removes b unless it is pinned, leased (for leaseTTL), or was
// used since the oldest hold began, since users (when the oldest process
// sharing the store began) or within minAge, all looked at again under the
// sweep lock, so that no Pin, Keep or writer settles on it meanwhile.
func (s *Store) removeIfIdle(u unit, minAge, leaseTTL time.Duration, users time.Time) (bool, error) {
	if err := s.refs.sweep.Lock(); err != nil {
		return false, err
	}
	defer s.refs.sweep.Unlock()
	hook("locked", u.Digest)
	if u.any(s.Pinned) || u.any(func(d string) bool { return s.leased(d, leaseTTL) && (u.pack == nil || !s.hasLoose(d)) }) {
		return false, nil
	}
	p := ""
	if u.pack != nil {
		p = s.packPath(u.pack.name)
	} else {
		var err error
		if p, err = s.Path(u.Digest); err != nil {
			return false, err
		}
	}
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("blob store: %w", err)
	}
	if u.pack != nil && (!st.Mode().IsRegular() || st.Size() != u.pack.size) {
		return false, nil // no longer the pack that was read: not removed
	}
	cutoff := s.refs.cutoff()
	if t := time.Now().Add(-minAge); t.Before(cutoff) {
		cutoff = t
	}
	if users.Before(cutoff) {
		cutoff = users
	}
	if !st.ModTime().Before(cutoff) {
		return false, nil
	}
	hook("checked", u.Digest)
	if u.pack != nil {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("blob store: %w", err)
		}
		s.packs.mu.Lock()
		if s.packs.known[u.pack.name] == u.pack {
			s.dropPackLocked(u.pack)
		}
		s.packs.mu.Unlock()
		return true, nil
	}
	if err := s.remove(u.Digest); err != nil {
		return false, err
	}
	return true, nil
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
