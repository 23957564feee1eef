package supervisor

import (
	"context"
	"fmt"
)

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
