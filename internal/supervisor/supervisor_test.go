package supervisor

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// An assessment whose report is not in the store (evicted before it was
// assessed) is never retained: the request fails, naming it, and a later
// request with the report there gets a real assessment; once one is
// retained, losing the report does not replace it.
func TestAssessNeverRetainsMissingEvidence(t *testing.T) {
	ctx := context.Background()
	pass := readFixture(t, "gotest/pass.json")
	ev := func(report []byte) Evidence {
		e := evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, pass, 0)
		if report == nil {
			e.Report = nil
		}
		return e
	}
	store := NewMemoryStore()
	s := New(store)
	if _, _, err := s.Assess(ctx, ev(nil)); !errors.Is(err, ErrEvidenceUnavailable) || !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("report missing: got %v, want ErrEvidenceUnavailable", err)
	}
	a, err := Judge(ev(pass))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Load(ctx, a.Binding.Key()); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("something was retained for an assessment without its report: %v", err)
	}
	got, retained, err := s.Assess(ctx, ev(pass))
	if err != nil || got.Verdict != Passed {
		t.Fatalf("with the report: %v %v, want passed", got.Verdict, err)
	}
	again, b, err := s.Assess(ctx, ev(nil))
	if err != nil || again.Verdict != Passed || !bytes.Equal(b, retained) {
		t.Errorf("report gone after a retained assessment: got %v %v (same bytes %v), want the retained one", again.Verdict, err, bytes.Equal(b, retained))
	}
}
