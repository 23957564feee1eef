package broker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Limits beyond what the host can give one container are refused at
// admission (Preflight), naming the limit, the value asked and the host's
// most, and a run of such a job creates nothing; up to the host's most is
// accepted.
func TestPreflightRefusesLimitsBeyondTheHost(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	eng.NCPU, eng.MemTotal = 2, 4<<30
	for _, tt := range []struct {
		name  string
		mod   func(*sandbox.Job)
		field string // "" accepted
		says  []string
	}{
		{"the host's CPUs", func(j *sandbox.Job) { j.Limits.CPUMillis = 2000 }, "", nil},
		{"256 CPUs", func(j *sandbox.Job) { j.Limits.CPUMillis = 256_000 }, "job.limits.cpu_millis", []string{"256000 (256 CPUs)", "at most 2000 (2 CPUs"}},
		{"a millicore more", func(j *sandbox.Job) { j.Limits.CPUMillis = 2001 }, "job.limits.cpu_millis", []string{"2001 (2.001 CPUs)", "at most 2000"}},
		{"the host's memory", func(j *sandbox.Job) { j.Limits.MemoryBytes = 4 << 30 }, "", nil},
		{"memory beyond the host's", func(j *sandbox.Job) { j.Limits.MemoryBytes = 4<<30 + 1 }, "job.limits.memory_bytes", []string{"4294967297 bytes", "at most 4294967296"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			job := fakeJob(t, "host-"+strings.NewReplacer(" ", "-", "'", "").Replace(tt.name), tt.mod)
			err := b.Preflight(context.Background(), job)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v, want accepted", err)
				}
				return
			}
			var fe *sandbox.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("got %v, want a FieldError on %s (ErrInvalid)", err, tt.field)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("got %q, want it to say %q", err, s)
				}
			}
			before := len(eng.Containers())
			if _, err := b.Run(context.Background(), job); !errors.As(err, &fe) || fe.Field != tt.field {
				t.Errorf("Run: got %v, want the same refusal", err)
			}
			if n := eng.Called("ContainerCreate", ContainerName(b.cfg.Name, job.ID, job.Digest)); n != 0 || len(eng.Containers()) != before {
				t.Errorf("Run created %d containers of the job, want none", n)
			}
		})
	}
	if n := eng.Called("Info", ""); n != 1 {
		t.Errorf("the engine was asked for its host %d times, want once", n)
	}
}
