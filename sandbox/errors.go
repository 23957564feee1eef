package sandbox

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch on them with errors.Is; messages wrap them
// with the detail that names what was wrong.
var (
	// ErrInvalid marks a job, result or other input that fails validation.
	ErrInvalid = errors.New("invalid")
	// ErrConflict marks a job id already bound to a different digest.
	ErrConflict = errors.New("conflict")
	// ErrUncertain marks an outcome the broker cannot prove.
	ErrUncertain = errors.New("uncertain")
	// ErrNotFound marks a job, blob or image that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrImageRefused marks an image reference that is not a local image ID.
	ErrImageRefused = errors.New("image refused")
	// ErrTooLarge marks an input over a size or count limit.
	ErrTooLarge = errors.New("too large")
)

// NewSentinel returns a package's own sentinel error: its message is msg,
// and errors.Is matches it (and every error wrapping it) with each of
// classes, the classes above. Packages define their sentinels with it, so
// a caller can branch on the precise error or only on its class.
func NewSentinel(msg string, classes ...error) error {
	return &sentinel{msg: msg, classes: classes}
}

type sentinel struct {
	msg     string
	classes []error
}

func (e *sentinel) Error() string   { return e.msg }
func (e *sentinel) Unwrap() []error { return e.classes }

// FieldError names the field of an object that failed validation.
type FieldError struct {
	Field  string // dotted path, e.g. "job.limits.memory_bytes"
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
