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
