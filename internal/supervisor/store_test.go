package supervisor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

func TestStores(t *testing.T) {
	ctx := context.Background()
	key := sandbox.DigestBytes([]byte("binding"))
	stores := map[string]func(t *testing.T) Store{
		"memory": func(t *testing.T) Store { return NewMemoryStore() },
		"dir": func(t *testing.T) Store {
			s, err := NewDirStore(filepath.Join(t.TempDir(), "assessments"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			if _, err := s.Load(ctx, key); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("Load of nothing: got err %v, want ErrNotFound", err)
			}
			first := []byte(`{"verdict":"passed"}`)
			got, err := s.Retain(ctx, key, first)
			if err != nil || !bytes.Equal(got, first) {
				t.Fatalf("first Retain: got %q, %v; want %q", got, err, first)
			}
			got, err = s.Retain(ctx, key, bytes.Clone(first))
			if err != nil || !bytes.Equal(got, first) {
				t.Errorf("same Retain: got %q, %v; want %q", got, err, first)
			}
			got, err = s.Retain(ctx, key, []byte(`{"verdict":"failed"}`))
			if !errors.Is(err, sandbox.ErrConflict) {
				t.Errorf("different Retain: got err %v, want ErrConflict", err)
			}
			if !bytes.Equal(got, first) {
				t.Errorf("different Retain returned %q, want the retained %q", got, first)
			}
			loaded, err := s.Load(ctx, key)
			if err != nil || !bytes.Equal(loaded, first) {
				t.Errorf("Load: got %q, %v; want %q", loaded, err, first)
			}
		})
	}
}

// TestDirStoreConcurrentAndDurable: racing writers of different bytes end
// with one winner and conflicts for the rest; a new DirStore on the same
// directory sees the winner; no temporary files are left.
func TestDirStoreConcurrentAndDurable(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a")
	key := sandbox.DigestBytes([]byte("k"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, conflicts := 0, 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := NewDirStore(dir) // separate stores: no shared mutex
			if err != nil {
				t.Error(err)
				return
			}
			_, err = s.Retain(ctx, key, []byte{byte('a' + i)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, sandbox.ErrConflict):
				conflicts++
			default:
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if wins != 1 || conflicts != 7 {
		t.Errorf("got %d wins and %d conflicts, want 1 and 7", wins, conflicts)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !strings.HasSuffix(entries[0].Name(), ".json") {
		t.Errorf("directory holds %v, want one .json file", entries)
	}
	s2, _ := NewDirStore(dir)
	if b, err := s2.Load(ctx, key); err != nil || len(b) != 1 {
		t.Errorf("reopened Load: got %q, %v", b, err)
	}
	if _, err := s2.Retain(ctx, "../../etc/passwd", []byte("x")); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("bad key: got err %v, want ErrInvalid", err)
	}
}

// TestAssessConflict: the same binding with different evidence (a
// different policy, or other report bytes) is a conflict, and the retained
// assessment stands.
func TestAssessConflict(t *testing.T) {
	ctx := context.Background()
	pass := readFixture(t, "gotest/pass.json")
	dir := t.TempDir()
	store, err := NewDirStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	sup := New(store)
	ev := evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, pass, 0)
	a, first, err := sup.Assess(ctx, ev)
	if err != nil || a.Verdict != Passed {
		t.Fatalf("Assess: %s, %v", a.Verdict, err)
	}

	// Same inputs again, through a new store on the same directory.
	store2, _ := NewDirStore(dir)
	ev.Report = bytes.NewReader(pass)
	_, again, err := New(store2).Assess(ctx, ev)
	if err != nil || !bytes.Equal(again, first) {
		t.Errorf("again: got %d bytes, err %v; want the same %d bytes", len(again), err, len(first))
	}

	// Tampered report bytes for the same result.
	ev.Report = bytes.NewReader(bytes.Replace(pass, []byte(`"pass"`), []byte(`"fail"`), 1))
	if _, _, err := sup.Assess(ctx, ev); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("tampered report: got err %v, want ErrConflict", err)
	}
	// A looser policy for the same binding.
	ev.Report = bytes.NewReader(pass)
	ev.Policy = Policy{Format: FormatGoTestJSON, ReportPath: testReport, Required: []string{"example.com/fixtures/pass.TestAdd"}}
	if _, _, err := sup.Assess(ctx, ev); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("other policy: got err %v, want ErrConflict", err)
	}
	b, err := store.Load(ctx, a.Binding.Key())
	if err != nil || !bytes.Equal(b, first) {
		t.Errorf("retained bytes changed: %v", err)
	}
	back, err := DecodeAssessment(b)
	if err != nil || back.Verdict != Passed {
		t.Errorf("DecodeAssessment: %s, %v", back.Verdict, err)
	}
}

// TestStoresRemoveRetainedBefore: retention removes the keys retained
// before the cutoff, never one retained since, and the store counts what
// it holds; a writer's temporary file in a DirStore is left alone.
func TestStoresRemoveRetainedBefore(t *testing.T) {
	ctx := context.Background()
	old, young := sandbox.DigestBytes([]byte("old")), sandbox.DigestBytes([]byte("young"))
	check := func(t *testing.T, s Expiring, cutoff time.Time) {
		t.Helper()
		n, err := s.RemoveRetainedBefore(ctx, cutoff)
		if err != nil || n != 1 {
			t.Fatalf("RemoveRetainedBefore: got %d, %v; want 1", n, err)
		}
		if _, err := s.Load(ctx, old); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("the key retained before the cutoff: got %v, want it removed", err)
		}
		if _, err := s.Load(ctx, young); err != nil {
			t.Errorf("the key retained since: %v, want it kept", err)
		}
		if n, err := s.Len(ctx); err != nil || n != 1 {
			t.Errorf("Len: got %d, %v; want 1", n, err)
		}
		if n, err := s.RemoveRetainedBefore(ctx, cutoff); err != nil || n != 0 {
			t.Errorf("again: got %d, %v; want 0", n, err)
		}
		// Retained again after its removal, the key holds what it is given.
		if got, err := s.Retain(ctx, old, []byte("made again")); err != nil || string(got) != "made again" {
			t.Errorf("Retain after removal: got %q, %v", got, err)
		}
	}
	t.Run("memory", func(t *testing.T) {
		s := NewMemoryStore()
		if _, err := s.Retain(ctx, old, []byte("o")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		cutoff := time.Now()
		time.Sleep(10 * time.Millisecond)
		if _, err := s.Retain(ctx, young, []byte("y")); err != nil {
			t.Fatal(err)
		}
		check(t, s, cutoff)
	})
	t.Run("dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "assessments")
		s, err := NewDirStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for key, age := range map[string]time.Duration{old: 2 * time.Hour, young: time.Hour - time.Minute} {
			if _, err := s.Retain(ctx, key, []byte(key)); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, strings.TrimPrefix(key, "sha256:")+".json")
			if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
				t.Fatal(err)
			}
		}
		tmp := filepath.Join(dir, ".tmp-99")
		if err := os.WriteFile(tmp, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(tmp, now.Add(-3*time.Hour), now.Add(-3*time.Hour))
		check(t, s, now.Add(-time.Hour))
		if _, err := os.Stat(tmp); err != nil {
			t.Errorf("a writer's temporary file: %v, want it left alone", err)
		}
	})
}
