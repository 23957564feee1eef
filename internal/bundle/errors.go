package bundle

import (
	"github.com/sandboxd/sandboxd/sandbox"
)

// refusal is an input this package will not accept. Every refusal also
// matches sandbox.ErrInvalid, so callers that only need "bad input versus
// infrastructure failure" can branch on that one class; a ceiling also
// matches sandbox.ErrTooLarge. The type lets the tar reader tell a refusal
// from a failure to read.
type refusal struct{ sentinel error }

func (e *refusal) Error() string { return e.sentinel.Error() }
func (e *refusal) Unwrap() error { return e.sentinel }

func newRefusal(msg string, classes ...error) error {
	return &refusal{sandbox.NewSentinel(msg, append([]error{sandbox.ErrInvalid}, classes...)...)}
}

// Sentinel errors, one per class of refused input. Messages wrap them with
// the offending name: `"../x": path escapes the tree`.
var (
	ErrAbsolutePath    = newRefusal("absolute path")
	ErrPathEscapes     = newRefusal("path escapes the tree")
	ErrUncleanPath     = newRefusal("path is not clean")
	ErrControlChar     = newRefusal("name contains a control character")
	ErrInvalidUTF8     = newRefusal("name is not valid UTF-8")
	ErrPathTooLong     = newRefusal("path too long")
	ErrTooDeep         = newRefusal("path too deep")
	ErrDuplicate       = newRefusal("duplicate entry")
	ErrSymlinkEscapes  = newRefusal("symlink leaves the tree")
	ErrSymlink         = newRefusal("unsupported symlink")
	ErrHardLink        = newRefusal("hard link")
	ErrDevice          = newRefusal("device node")
	ErrFIFO            = newRefusal("fifo")
	ErrUnsupportedType = newRefusal("unsupported file type")
	ErrTooLarge        = newRefusal("byte ceiling exceeded", sandbox.ErrTooLarge)
	ErrTooManyFiles    = newRefusal("file ceiling exceeded", sandbox.ErrTooLarge)
	ErrChanged         = newRefusal("file changed while being read")
	ErrNotCanonical    = newRefusal("tar is not in canonical form")
	ErrDigestMismatch  = newRefusal("digest mismatch")
	ErrNotBundle       = newRefusal("not a sandboxd bundle")
)
