package sandbox

import (
	"errors"
	"fmt"
	"testing"
)

// classes is the vocabulary; a sentinel matches the classes it names and
// no other.
var classes = []error{ErrInvalid, ErrConflict, ErrUncertain, ErrNotFound, ErrImageRefused, ErrTooLarge}

func TestNewSentinelMatchesItsClassesOnly(t *testing.T) {
	cases := []struct {
		msg  string
		want []error
	}{
		{"blob not found", []error{ErrNotFound}},
		{"byte ceiling exceeded", []error{ErrInvalid, ErrTooLarge}},
		{"unclassified", nil},
	}
	for _, tc := range cases {
		s := NewSentinel(tc.msg, tc.want...)
		err := fmt.Errorf("blob x: %w", s)
		if got, want := err.Error(), "blob x: "+tc.msg; got != want {
			t.Errorf("message %q, want %q", got, want)
		}
		if !errors.Is(err, s) {
			t.Errorf("%v does not match its sentinel", err)
		}
		for _, c := range classes {
			want := false
			for _, w := range tc.want {
				want = want || w == c
			}
			if got := errors.Is(err, c); got != want {
				t.Errorf("errors.Is(%v, %v) = %v, want %v", err, c, got, want)
			}
		}
	}
	if errors.Is(NewSentinel("a", ErrInvalid), NewSentinel("a", ErrInvalid)) {
		t.Error("two sentinels with one message match each other")
	}
}
