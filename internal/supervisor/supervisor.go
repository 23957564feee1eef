package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// ErrEvidenceUnavailable marks evidence that was made but is not in the
// store now (a report artifact evicted before it was assessed): nothing is
// retained, since the assessment it would make says nothing of the
// candidate and would stand forever under a key that ignores why. It
// wraps sandbox.ErrNotFound.
var ErrEvidenceUnavailable = fmt.Errorf("evidence unavailable: %w", sandbox.ErrNotFound)

// Supervisor evaluates evidence and retains the assessments.
type Supervisor struct {
	store Store
}

// New returns a Supervisor that retains assessments in store.
func New(store Store) *Supervisor { return &Supervisor{store: store} }

// Assess evaluates the evidence and retains the assessment under its
// binding. Asked again with the same evidence it returns the same bytes;
// different evidence for a retained binding is an error wrapping
// sandbox.ErrConflict, and the retained assessment stands.
func (s *Supervisor) Assess(ctx context.Context, ev Evidence) (Assessment, []byte, error) {
	a, err := Judge(ev)
	if err != nil {
		return Assessment{}, nil, err
	}
	if missing := unavailable(a); missing != "" {
		// What was retained while the evidence was there stands.
		if b, err := s.store.Load(ctx, a.Binding.Key()); err == nil {
			var old Assessment
			if err := json.Unmarshal(b, &old); err != nil {
				return Assessment{}, nil, fmt.Errorf("retained assessment %s: %w", a.Binding.Key(), err)
			}
			return old, b, nil
		} else if !errors.Is(err, sandbox.ErrNotFound) {
			return Assessment{}, nil, err
		}
		return Assessment{}, nil, fmt.Errorf("assessment not made (%s): %w", missing, ErrEvidenceUnavailable)
	}
	data, err := a.CanonicalJSON()
	if err != nil {
		return Assessment{}, nil, fmt.Errorf("assessment: %w", err)
	}
	retained, err := s.store.Retain(ctx, a.Binding.Key(), data)
	if err != nil {
		return Assessment{}, nil, err
	}
	return a, retained, nil
}

// unavailable is the reason of an assessment made without evidence that
// exists (RuleReportUnavailable), or "".
func unavailable(a Assessment) string {
	for _, r := range a.Reasons {
		if strings.HasPrefix(r, string(RuleReportUnavailable)) {
			return r
		}
	}
	return ""
}
