package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Store retains assessments by key (Binding.Key).
type Store interface {
	// Retain keeps data under key unless the key already holds bytes. It
	// returns the retained bytes: data, or the same bytes kept before. If
	// the key holds different bytes, it returns those and an error wrapping
	// sandbox.ErrConflict; they are never replaced.
	Retain(ctx context.Context, key string, data []byte) ([]byte, error)
	// Load returns the bytes retained under key, or an error wrapping
	// sandbox.ErrNotFound.
	Load(ctx context.Context, key string) ([]byte, error)
}

// Expiring is a Store that removes what it retained before a time: the
// daemon's retention (sandboxd serve --retain).
type Expiring interface {
	Store
	// RemoveRetainedBefore removes every key retained before cutoff,
	// never one retained since, and returns how many it removed.
	RemoveRetainedBefore(ctx context.Context, cutoff time.Time) (int, error)
	// Len is how many keys the store holds.
	Len(ctx context.Context) (int, error)
}

var (
	_ Expiring = (*MemoryStore)(nil)
	_ Expiring = (*DirStore)(nil)
)

// RemoveRetainedBefore removes the assessments, and their signed forms,
// retained before cutoff (each key by when it was retained: a signed form
// may be younger than its assessment), if the store is Expiring; asked
// again, such an assessment is made again from its evidence, if the
// evidence is still there. It returns how many keys it removed.
func (s *Supervisor) RemoveRetainedBefore(ctx context.Context, cutoff time.Time) (int, error) {
	e, ok := s.store.(Expiring)
	if !ok {
		return 0, nil
	}
	return e.RemoveRetainedBefore(ctx, cutoff)
}

// Retained is how many keys (assessments and signed forms) the store
// holds, if the store is Expiring (0 otherwise).
func (s *Supervisor) Retained(ctx context.Context) (int, error) {
	e, ok := s.store.(Expiring)
	if !ok {
		return 0, nil
	}
	return e.Len(ctx)
}

// MemoryStore is a Store in memory, for tests and one-shot runs.
type MemoryStore struct {
	mu sync.Mutex
	m  map[string][]byte
	at map[string]time.Time // when each key was retained
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{m: map[string][]byte{}, at: map[string]time.Time{}}
}

// Retain implements Store.
func (s *MemoryStore) Retain(ctx context.Context, key string, data []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[key]; ok {
		return conflictUnlessEqual(key, old, data)
	}
	s.m[key] = bytes.Clone(data)
	s.at[key] = time.Now()
	return bytes.Clone(data), nil
}

// RemoveRetainedBefore implements Expiring.
func (s *MemoryStore) RemoveRetainedBefore(ctx context.Context, cutoff time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, at := range s.at {
		if at.Before(cutoff) {
			delete(s.m, k)
			delete(s.at, k)
			n++
		}
	}
	return n, nil
}

// Len implements Expiring.
func (s *MemoryStore) Len(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m), nil
}

// Load implements Store.
func (s *MemoryStore) Load(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[key]
	if !ok {
		return nil, fmt.Errorf("assessment %s: %w", key, sandbox.ErrNotFound)
	}
	return bytes.Clone(b), nil
}

func conflictUnlessEqual(key string, old, data []byte) ([]byte, error) {
	if bytes.Equal(old, data) {
		return bytes.Clone(old), nil
	}
	return bytes.Clone(old), fmt.Errorf("assessment %s: different evidence for a retained binding: %w", key, sandbox.ErrConflict)
}

// DirStore is a Store in a directory, one file per key. A file is written
// to a temporary name, fsynced, then linked into place, which fails if the
// name exists, so that concurrent writers cannot replace a retained
// assessment (a rename would); the directory is fsynced after.
type DirStore struct {
	dir string
	mu  sync.Mutex
}

// NewDirStore returns a DirStore in dir, creating it (0700) if needed.
func NewDirStore(dir string) (*DirStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("assessment store: %w", err)
	}
	return &DirStore{dir: dir}, nil
}

func (s *DirStore) path(key string) (string, error) {
	if !sandbox.ValidDigest(key) {
		return "", fmt.Errorf("assessment key %q: %w", key, sandbox.ErrInvalid)
	}
	return filepath.Join(s.dir, strings.TrimPrefix(key, "sha256:")+".json"), nil
}

// Retain implements Store.
func (s *DirStore) Retain(ctx context.Context, key string, data []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	final, err := s.path(key)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, err := os.ReadFile(final); err == nil {
		return conflictUnlessEqual(key, old, data)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	if err := os.Link(tmp.Name(), final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another process retained it first.
			old, rerr := os.ReadFile(final)
			if rerr != nil {
				return nil, fmt.Errorf("assessment %s: %w", key, rerr)
			}
			return conflictUnlessEqual(key, old, data)
		}
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	if err := syncDir(s.dir); err != nil {
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	return bytes.Clone(data), nil
}

// Load implements Store.
func (s *DirStore) Load(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("assessment %s: %w", key, sandbox.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("assessment %s: %w", key, err)
	}
	return b, nil
}

// retainedKey is the key of a file name of the store's: a retained
// assessment or signed form, not a writer's temporary file.
func retainedKey(name string) (string, bool) {
	hex, ok := strings.CutSuffix(name, ".json")
	key := "sha256:" + hex
	return key, ok && sandbox.ValidDigest(key)
}

// RemoveRetainedBefore implements Expiring: a file is retained when it is
// linked into place, written once and never changed, so its modification
// time is when its key was retained. Writers' temporary files are left
// alone (one of another process may be about to be linked).
func (s *DirStore) RemoveRetainedBefore(ctx context.Context, cutoff time.Time) (int, error) {
	// Under s.mu: a Retain of this process is never between its check
	// and its link, so a key it just retained is not taken for an old one.
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("assessment store: %w", err)
	}
	n := 0
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if _, ok := retainedKey(e.Name()); !ok || !e.Type().IsRegular() {
			continue
		}
		st, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("assessment store: %w", err)
		}
		if !st.ModTime().Before(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("assessment store: %w", err)
		}
		n++
	}
	if n > 0 {
		if err := syncDir(s.dir); err != nil {
			return n, fmt.Errorf("assessment store: %w", err)
		}
	}
	return n, nil
}

// Len implements Expiring.
func (s *DirStore) Len(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("assessment store: %w", err)
	}
	n := 0
	for _, e := range ents {
		if _, ok := retainedKey(e.Name()); ok && e.Type().IsRegular() {
			n++
		}
	}
	return n, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
