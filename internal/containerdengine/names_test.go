package containerdengine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd"
	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// realContainerd is an engine on this machine's containerd, in a
// namespace of the test's own (removed at its end), with nothing but its
// connection: for what containerd itself decides. Without a containerd
// the test is skipped, and fails under CI.
func realContainerd(t *testing.T) *Engine {
	t.Helper()
	for _, a := range DefaultAddresses {
		if _, err := os.Stat(a); err != nil {
			continue
		}
		ns := "sandboxd-unit-" + t.Name()
		c, err := containerd.New(a, containerd.WithDefaultNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := namespaces.WithNamespace(context.Background(), ns)
			ls := c.LeasesService()
			if held, err := ls.List(ctx); err == nil {
				for _, l := range held {
					ls.Delete(ctx, l)
				}
			}
			c.NamespaceService().Delete(ctx, ns)
			c.Close()
		})
		return &Engine{cfg: Config{Address: a, Namespace: ns, StateDir: t.TempDir()}, c: c}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no containerd socket, and CI=true")
	}
	t.Skip("no containerd socket")
	return nil
}

// A create killed after it took its container's name and before
// containerd recorded the container leaves the name taken by nothing.
// Removing the container by that name frees it (the restart of a daemon
// proves such a job never ran, removes its container by name, and runs
// it: before, the name stayed taken and the run conflicted, ending the
// job uncertain: CI, TestFleetSoak on containerd). A create of this
// process under way keeps its name.
func TestRemoveFreesTheNameOfAKilledCreate(t *testing.T) {
	e := realContainerd(t)
	ctx := e.ns(context.Background())
	const name = "sandboxd-unit-job-1"
	if err := e.reserveName(ctx, name, name); err != nil {
		t.Fatal(err)
	}
	_, err := e.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("remove a container never recorded: %v, want not found", err)
	}
	if err := e.reserveName(ctx, name, name); err != nil {
		t.Fatalf("take the name again after the removal: %v, want it free", err)
	}

	// Taken for a container of another ID (every create's since IDs are
	// fresh) that was never recorded: freed as well.
	if err := e.releaseNames(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := e.reserveName(ctx, name, newID(name)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); !errdefs.IsNotFound(err) {
		t.Fatalf("remove a container of a fresh ID never recorded: %v, want not found", err)
	}
	if err := e.reserveName(ctx, name, name); err != nil {
		t.Fatalf("take the name again after the removal: %v, want it free", err)
	}

	// Taken by a create of this process under way: kept.
	e.creating = map[string]bool{name: true}
	if _, err := e.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); !errdefs.IsNotFound(err) {
		t.Fatalf("remove while a create is under way: %v, want not found", err)
	}
	if err := e.reserveName(ctx, name, name); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("the name of a create under way after a removal: %v, want still taken", err)
	}
}

// The event stream tells its end on Err once its context is cancelled,
// whatever it was doing: here, holding an event its reader has not taken
// (the buffer full). Before, it returned without a word, and a reader
// that stops the stream and waits for its end waited for ever (CI: the
// daemon soak on containerd hung at its end). containerd's own client
// does the same when cancelled while it hands over an event, which this
// stream now covers too.
func TestEventsEndOnCancelWhileHoldingAnEvent(t *testing.T) {
	e := realContainerd(t)
	ctx, cancel := context.WithCancel(e.ns(context.Background()))
	defer cancel()
	res := e.Events(ctx, client.EventsListOptions{})
	time.Sleep(200 * time.Millisecond) // subscribed
	pub := e.c.EventService()
	for i := range 300 { // more than the stream holds: it waits on its reader
		id := fmt.Sprintf("unit-%d", i)
		if err := pub.Publish(e.ns(context.Background()), "/containers/update", &eventstypes.ContainerUpdate{ID: id, Labels: map[string]string{labelName: id + "-renamed"}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(10 * time.Second)
	for len(res.Messages) < cap(res.Messages) {
		select {
		case <-deadline:
			t.Fatalf("the stream holds %d events, want it full (%d)", len(res.Messages), cap(res.Messages))
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(100 * time.Millisecond) // the next event is being handed over
	cancel()
	select {
	case err := <-res.Err:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the stream ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not tell its end within 5 s of the cancel")
	}
}
