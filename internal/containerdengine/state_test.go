package containerdengine

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd"
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

// What each task state and start label reads as. A task still created
// never started, even with the label: the label is set just before the
// start is asked, and a daemon killed between the two left a job that
// provably never ran (read as started, it would end uncertain instead of
// running).
func TestStateOf(t *testing.T) {
	const at, never = "2026-12-05T10:00:00Z", "0001-01-01T00:00:00Z"
	exited := time.Date(2026, 12, 5, 10, 0, 3, 0, time.UTC)
	cases := []struct {
		name    string
		started string
		st      containerd.Status
		hasTask bool
		want    container.State
	}{
		{"no task, never asked to start", "", containerd.Status{}, false, container.State{Status: container.StateCreated, StartedAt: never, FinishedAt: never}},
		{"no task after a start", at, containerd.Status{}, false, container.State{Status: container.StateDead, StartedAt: at, FinishedAt: never}},
		{"task created, never asked to start", "", containerd.Status{Status: containerd.Created}, true, container.State{Status: container.StateCreated, StartedAt: never, FinishedAt: never, Pid: 7}},
		{"task created, start asked and not made", at, containerd.Status{Status: containerd.Created}, true, container.State{Status: container.StateCreated, StartedAt: never, FinishedAt: never, Pid: 7}},
		{"running", at, containerd.Status{Status: containerd.Running}, true, container.State{Status: container.StateRunning, Running: true, StartedAt: at, FinishedAt: never, Pid: 7}},
		{"stopped", at, containerd.Status{Status: containerd.Stopped, ExitStatus: 3, ExitTime: exited}, true, container.State{Status: container.StateExited, ExitCode: 3, StartedAt: at, FinishedAt: exited.Format(time.RFC3339Nano)}},
		{"unknown", at, containerd.Status{Status: containerd.Unknown}, true, container.State{Status: container.StateDead, StartedAt: at, FinishedAt: never, Pid: 7}},
	}
	for _, tc := range cases {
		if got := stateOf(tc.started, tc.st, 7, tc.hasTask); *got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, *got, tc.want)
		}
	}
}
