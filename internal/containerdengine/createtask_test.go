package containerdengine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// A task create is never cut short by its caller: the caller whose context
// ends is answered at once, the create goes on under a context of its own,
// a removal of the container waits for it, and no create begins while a
// removal is under way. (containerd 1.6 leaves the shim of a create cut
// short running for good: shims.go.)
func TestATaskCreateRunsToItsEnd(t *testing.T) {
	var e Engine
	started, release := make(chan struct{}), make(chan struct{})
	createCtx := make(chan context.Context, 1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- e.createTask(ctx, "c.0123abcd", func(cctx context.Context) error {
			createCtx <- cctx
			close(started)
			<-release
			return cctx.Err()
		})
	}()
	<-started
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the caller whose context ended: %v, want its context's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller whose context ended was not answered while the create went on")
	}
	cctx := <-createCtx
	if cctx.Err() != nil {
		t.Fatalf("the create's own context ended with its caller's: %v", cctx.Err())
	}

	// The removal waits for the create.
	removed := make(chan func(), 1)
	go func() {
		end, err := e.beginRemoval(context.Background(), "c.0123abcd")
		if err != nil {
			t.Error(err)
		}
		removed <- end
	}()
	select {
	case <-removed:
		t.Fatal("the removal began while the create was under way")
	case <-time.After(100 * time.Millisecond):
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if _, err := e.beginRemoval(short, "c.0123abcd"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a removal whose context ends while the create goes on: %v", err)
	}
	close(release)
	var end func()
	select {
	case end = <-removed:
	case <-time.After(10 * time.Second):
		t.Fatal("the removal did not begin once the create ended")
	}

	// While the removal is under way no create begins; after it, one does.
	called := false
	if err := e.createTask(context.Background(), "c.0123abcd", func(context.Context) error { called = true; return nil }); !errdefs.IsNotFound(err) || called {
		t.Errorf("a create during the removal: %v (called %v), want refused as not found", err, called)
	}
	end()
	if err := e.createTask(context.Background(), "c.0123abcd", func(context.Context) error { called = true; return nil }); err != nil || !called {
		t.Errorf("a create after the removal: %v (called %v)", err, called)
	}
	// A caller whose context already ended starts nothing.
	called = false
	if err := e.createTask(ctx, "c.4567abcd", func(context.Context) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Errorf("a create with its caller's context ended: %v (called %v)", err, called)
	}
	e.tasksInFlight(time.Second)
	if n := len(e.makingTasks); n != 0 {
		t.Errorf("%d creates still recorded in flight", n)
	}
}

// Two removals of a container at once (the job's own and the reaper's):
// creates stay refused until the last has ended.
func TestOverlappingRemovalsRefuseCreatesUntilTheLast(t *testing.T) {
	var e Engine
	first, err := e.beginRemoval(context.Background(), "c.0123abcd")
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.beginRemoval(context.Background(), "c.0123abcd")
	if err != nil {
		t.Fatal(err)
	}
	create := func() error {
		return e.createTask(context.Background(), "c.0123abcd", func(context.Context) error { return nil })
	}
	first()
	first() // ending twice counts once
	if err := create(); !errdefs.IsNotFound(err) {
		t.Errorf("a create while the second removal is under way: %v, want refused", err)
	}
	second()
	if err := create(); err != nil {
		t.Errorf("a create after both removals: %v", err)
	}
}
