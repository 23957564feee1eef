package broker

import (
	"context"
	"strings"
	"sync"
	"testing"
)

// OnProgress is told a job's phases in order: staging from the start,
// then running once the inputs are sent.
func TestProgressHookPhases(t *testing.T) {
	b, _ := newFakeBroker(t, 0)
	var mu sync.Mutex
	var phases []string
	_, err := b.RunWithHooks(context.Background(), fakeJob(t, "job-progress"), Hooks{OnProgress: func(phase string, _, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		if len(phases) == 0 || phases[len(phases)-1] != phase {
			phases = append(phases, phase)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(phases, " "); !strings.HasPrefix(got, "staging running") {
		t.Errorf("phases %q, want staging then running", got)
	}
}
