package store

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestErrorsMatchTheirClass: what the store refuses matches both its own
// sentinel and the sandbox class callers branch on.
func TestErrorsMatchTheirClass(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tampered, _, err := s.Put(strings.NewReader("hello"), "", -1)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := s.Path(tampered)
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, []byte("hellO"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := "sha256:" + strings.Repeat("0", 64)
	cases := []struct {
		name       string
		do         func() error
		own, class error
	}{
		{"open a missing blob", func() error { _, err := s.Open(missing); return err }, ErrNotFound, sandbox.ErrNotFound},
		{"put under a wrong digest", func() error { _, _, err := s.Put(strings.NewReader("x"), missing, -1); return err }, ErrDigestMismatch, sandbox.ErrInvalid},
		{"verify a changed blob", func() error { return s.Verify(tampered) }, ErrDigestMismatch, sandbox.ErrInvalid},
		{"put over the cap", func() error { _, _, err := s.Put(bytes.NewReader(make([]byte, 11)), "", 10); return err }, ErrTooLarge, sandbox.ErrTooLarge},
	}
	for _, tc := range cases {
		err := tc.do()
		if !errors.Is(err, tc.own) || !errors.Is(err, tc.class) {
			t.Errorf("%s: got %v, want %v and %v", tc.name, err, tc.own, tc.class)
		}
	}
}
