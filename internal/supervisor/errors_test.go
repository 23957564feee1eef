package supervisor

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestErrorsMatchTheirClass: the supervisor's refusals match both their
// own sentinel and the sandbox class callers branch on.
func TestErrorsMatchTheirClass(t *testing.T) {
	cases := []struct {
		name       string
		do         func() error
		own, class error
	}{
		{"a DTD in a JUnit report", func() error {
			_, err := Parse(FormatJUnitXML, strings.NewReader(`<?xml version="1.0"?><!DOCTYPE x []><testsuites/>`), ParseLimits{})
			return err
		}, ErrUnparseable, sandbox.ErrInvalid},
		{"a TAP report over its byte limit", func() error {
			_, err := Parse(FormatTAP, strings.NewReader("1..1\n"+strings.Repeat("# comment\n", 100)), ParseLimits{MaxBytes: 64})
			return err
		}, ErrTooLarge, sandbox.ErrTooLarge},
		{"the statement of an inconclusive verdict", func() error {
			a := mustJudge(t, evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, readFixture(t, "gotest/timeout.json"), 1))
			_, err := a.Statement()
			return err
		}, ErrInconclusive, sandbox.ErrNotFound},
	}
	for _, tc := range cases {
		err := tc.do()
		if !errors.Is(err, tc.own) || !errors.Is(err, tc.class) {
			t.Errorf("%s: got %v, want %v and %v", tc.name, err, tc.own, tc.class)
		}
	}
}
