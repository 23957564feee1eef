package client_test

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// Each of the daemon's error codes reaches the caller as the public
// sentinels it means: too_large is both an invalid input and too large.
func TestAPIErrorCodesUnwrapToTheSentinels(t *testing.T) {
	all := []error{sandbox.ErrInvalid, sandbox.ErrTooLarge, sandbox.ErrConflict, sandbox.ErrNotFound, sandbox.ErrImageRefused, client.ErrBusy}
	for _, c := range []struct {
		code string
		want []error
	}{
		{"invalid", []error{sandbox.ErrInvalid}},
		{"too_large", []error{sandbox.ErrInvalid, sandbox.ErrTooLarge}},
		{"conflict", []error{sandbox.ErrConflict}},
		{"not_found", []error{sandbox.ErrNotFound}},
		{"image_refused", []error{sandbox.ErrImageRefused}},
		{"queue_full", []error{client.ErrBusy}},
		{"draining", []error{client.ErrBusy}},
		{"internal", nil},
	} {
		err := error(&client.APIError{StatusCode: 400, Code: c.code, Message: "m"})
		for _, s := range all {
			want := false
			for _, w := range c.want {
				want = want || w == s
			}
			if got := errors.Is(err, s); got != want {
				t.Errorf("code %q: errors.Is(%v) = %v, want %v", c.code, s, got, want)
			}
		}
	}
}

// A tenant at its max_jobs is busy (429, submitted again after
// Retry-After); over another quota it is refused.
func TestQuotaExceededIsBusyOnlyAt429(t *testing.T) {
	for _, c := range []struct {
		status int
		busy   bool
	}{{429, true}, {403, false}, {507, false}} {
		err := error(&client.APIError{StatusCode: c.status, Code: "quota_exceeded", Message: "m"})
		if got := errors.Is(err, client.ErrBusy); got != c.busy {
			t.Errorf("quota_exceeded at %d: busy %v, want %v", c.status, got, c.busy)
		}
	}
}
