package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A store is shared when several processes use its directory at once:
// one-shot commands (`sandboxd run`, `sandboxd exec`) running side by side
// on one state directory, which none of them locks for itself. Pins and
// holds live in one process's memory, so in a shared store two more
// things keep a sweep of one process from removing what another needs:
//
//   - the sweep lock extends to every sharing process through an flock on
//     DIR/sweep.lock: shared while a blob is claimed (Pin, Keep, a writer
//     settling on a copy in place), exclusive while a sweep removes one;
//   - each sharing process registers in DIR/users/ (a file it holds an
//     flock on while it lives, timestamped when it began), and a sweep
//     spares every blob used since the oldest live one began: everything a
//     process needs it wrote or touched after it registered.
//
// A process that dies releases its flocks with it; the next sweep removes
// its registration.

// sweepLock excludes a sweep's removal of a blob from claims on it: in
// this process by an RWMutex, and in every process sharing the store by
// an flock, shared for claims, exclusive for removals.
type sweepLock struct {
	rw sync.RWMutex
	mu sync.Mutex // guards f and readers
	// f is DIR/sweep.lock once the store is shared. One open file holds
	// the process's flock: the first claim takes it shared, the last one
	// releases it, and a removal (with every claim of this process
	// excluded by rw) takes it exclusive.
	f       *os.File
	readers int
}

// RLock takes the lock for a claim. If the flock cannot be had (it only
// fails on a broken file system), the claim goes on: what it claims may
// then be removed by another process's sweep, and a job that needs it
// fails its input check rather than using something else.
func (l *sweepLock) RLock() {
	l.rw.RLock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.readers == 0 {
		flock(l.f, unix.LOCK_SH)
	}
	l.readers++
}

func (l *sweepLock) RUnlock() {
	l.mu.Lock()
	if l.f != nil && l.readers > 0 {
		if l.readers--; l.readers == 0 {
			flock(l.f, unix.LOCK_UN)
		}
	}
	l.mu.Unlock()
	l.rw.RUnlock()
}

// Lock takes the lock for a removal; an error means nothing may be removed.
func (l *sweepLock) Lock() error {
	l.rw.Lock()
	l.mu.Lock()
	f := l.f
	l.mu.Unlock()
	if f != nil {
		if err := flock(f, unix.LOCK_EX); err != nil {
			l.rw.Unlock()
			return fmt.Errorf("blob store: sweep lock: %w", err)
		}
	}
	return nil
}

func (l *sweepLock) Unlock() {
	l.mu.Lock()
	f := l.f
	l.mu.Unlock()
	if f != nil {
		flock(f, unix.LOCK_UN)
	}
	l.rw.Unlock()
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// Share makes the store safe to use from several processes at once and
// registers this process as one of its users until leave is called (see
// above). Call it before any other use of the store. After leave, the
// blobs this process used are collected like any others; the store stays
// shared.
func (s *Store) Share() (leave func(), err error) {
	lf, err := os.OpenFile(filepath.Join(s.dir, "sweep.lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	dir := filepath.Join(s.dir, "users")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		lf.Close()
		return nil, fmt.Errorf("blob store: %w", err)
	}
	// Registered under a name sweeps ignore until it is flocked, so that
	// no sweep takes it for a dead process's.
	var rnd [6]byte
	rand.Read(rnd[:])
	name := strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:])
	tmp := filepath.Join(dir, ".new-"+name)
	uf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("blob store: register: %w", err)
	}
	// A second of margin for file systems whose timestamps are coarse, as
	// Hold keeps.
	began := time.Now().Add(-time.Second)
	err = flock(uf, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		err = os.Chtimes(tmp, began, began)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		uf.Close()
		os.Remove(tmp)
		lf.Close()
		return nil, fmt.Errorf("blob store: register: %w", err)
	}
	// With every claim of this process excluded, none is half counted.
	l := &s.refs.sweep
	l.rw.Lock()
	l.mu.Lock()
	if l.f == nil {
		l.f = lf
	} else {
		lf.Close()
	}
	l.mu.Unlock()
	l.rw.Unlock()
	s.mu.Lock()
	s.users = dir
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			os.Remove(filepath.Join(dir, name))
			uf.Close()
		})
	}, nil
}

// usersCutoff is when the oldest live process sharing the store began, or
// now. It removes the registrations of processes that died.
func (s *Store) usersCutoff() time.Time {
	c := time.Now()
	s.mu.Lock()
	dir := s.users
	s.mu.Unlock()
	if dir == "" {
		return c
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		// Nothing can be known of the others: spare every blob.
		return time.Time{}
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".new-") {
			// A registration being made, or one a process died making.
			if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > time.Minute && !held(p) {
				os.Remove(p)
			}
			continue
		}
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // it left meanwhile
		}
		if err != nil {
			return time.Time{}
		}
		if !held(p) {
			os.Remove(p) // its process is gone
			continue
		}
		if st.ModTime().Before(c) {
			c = st.ModTime()
		}
	}
	return c
}

// held reports whether a live process holds the flock on the file at p.
// An error other than "it is held" counts as held: a sweep keeps blobs
// when in doubt.
// Only a regular file is opened (never through a symlink, never blocking
// on a FIFO): anything else is not a registration and counts as held.
func held(p string) bool {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return true
	}
	return unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil
}
