package containerdengine

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/moby/moby/api/types/container"
)

// Recovery reads "created" as "never started" (the job provably never
// ran, and runs). A container with no task is created only if it was
// never started; one that was started and has no task (deleted after a
// failed start, lost with containerd's state) is dead; a task that cannot
// be read is an error. Before, every failed read of the task said
// "created", and a recovery would have run a started job again.
func TestStateOfAContainerWithoutItsTask(t *testing.T) {
	e := realContainerd(t)
	ctx := e.ns(context.Background())
	info := containers.Container{ID: "sandboxd-unit-no-task", Labels: map[string]string{}}
	s, err := e.state(ctx, info)
	if err != nil || s.Status != container.StateCreated || s.StartedAt != "0001-01-01T00:00:00Z" {
		t.Fatalf("never started: %+v, %v; want created, never started", s, err)
	}
	info.Labels[labelStarted] = time.Now().UTC().Format(time.RFC3339Nano)
	if s, err = e.state(ctx, info); err != nil || s.Status != container.StateDead || s.Running {
		t.Errorf("started, its task gone: %+v, %v; want dead", s, err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for _, started := range []string{"", info.Labels[labelStarted]} {
		info.Labels[labelStarted] = started
		if s, err := e.state(gone, info); err == nil {
			t.Errorf("the task unread (started %q): %+v, want an error", started, s)
		}
	}
}
