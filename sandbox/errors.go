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
)

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
