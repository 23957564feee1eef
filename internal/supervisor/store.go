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

var (
	_ Store = (*MemoryStore)(nil)
	_ Store = (*DirStore)(nil)
)

// MemoryStore is a Store in memory, for tests and one-shot runs.
type MemoryStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{m: map[string][]byte{}} }

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
	return bytes.Clone(data), nil
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
