package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The drain timeout holds for a job a worker is running: Shutdown returns
// when its context ends, saying how many jobs are left, instead of
// waiting for the workers (and so for their jobs) before it counts.
func TestShutdownDrainTimeoutHoldsForARunningJob(t *testing.T) {
	f := newFixture(t, nil, nil)
	gate := make(chan struct{})
	f.fb.mu.Lock()
	f.fb.gates["d-1"] = gate
	f.fb.mu.Unlock()
	defer close(gate) // before the fixture's own Shutdown, which waits
	if code, _, _ := f.submit(t, newJob(t, "d-1", "true")); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		f.fb.mu.Lock()
		active := f.fb.active
		f.fb.mu.Unlock()
		if active == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never started running")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "1 jobs still running") {
			t.Errorf("Shutdown: %v; want 1 job still running and the deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown had not returned 5 s after a 300 ms drain timeout, with the job still running")
	}
}
