package selfcheck

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
)

// fakeCheck counts calls per key; a key with a channel in block waits on
// it (or on ctx) before answering with the error in fail.
type fakeCheck struct {
	mu    sync.Mutex
	calls map[GateKey]int
	block map[GateKey]chan struct{}
	fail  map[GateKey]error
	// cancelled receives the key of a check whose context ended.
	cancelled chan GateKey
}

func newFakeCheck() *fakeCheck {
	return &fakeCheck{calls: map[GateKey]int{}, block: map[GateKey]chan struct{}{}, fail: map[GateKey]error{}, cancelled: make(chan GateKey, 16)}
}

func (f *fakeCheck) check(ctx context.Context, k GateKey) error {
	f.mu.Lock()
	f.calls[k]++
	block, err := f.block[k], f.fail[k]
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			f.cancelled <- k
			return ctx.Err()
		}
	}
	return err
}

func (f *fakeCheck) callsOf(k GateKey) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[k]
}

// waitWaiters yields until n callers wait on k's check.
func waitWaiters(g *Gate, k GateKey, n int) {
	for {
		g.mu.Lock()
		c := g.inflight[k]
		got := 0
		if c != nil {
			got = c.waiters
		}
		g.mu.Unlock()
		if got >= n {
			return
		}
		runtime.Gosched()
	}
}

// checkConcurrently starts n callers of k and returns once all of them
// wait on its check; their answers arrive on the channel.
func checkConcurrently(g *Gate, k GateKey, n int) <-chan error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- g.Check(context.Background(), k) }()
	}
	waitWaiters(g, k, n)
	return errs
}

var (
	keyA = GateKey{Engine: "unix:///e", Image: "sha256:aa", Runtime: "runc"}
	keyB = GateKey{Engine: "unix:///e", Image: "sha256:bb", Runtime: "runc"}
)

func TestGateSameKeyChecksOnce(t *testing.T) {
	f := newFakeCheck()
	release := make(chan struct{})
	f.block[keyA] = release
	g := NewGate(f.check)
	const n = 8
	errs := checkConcurrently(g, keyA, n)
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("got %v, want nil", err)
		}
	}
	if err := g.Check(context.Background(), keyA); err != nil {
		t.Errorf("after the pass: got %v, want nil", err)
	}
	if got := f.callsOf(keyA); got != 1 {
		t.Errorf("got %d checks of one key for %d callers and one later, want 1", got, n)
	}
}

func TestGateOtherKeysProceedWhileOneIsChecked(t *testing.T) {
	f := newFakeCheck()
	blockA := make(chan struct{})
	f.block[keyA] = blockA
	g := NewGate(f.check)
	errA := make(chan error, 1)
	go func() { errA <- g.Check(context.Background(), keyA) }()
	waitWaiters(g, keyA, 1)
	// Image B is checked, and passes, while A's check still blocks.
	if err := g.Check(context.Background(), keyB); err != nil {
		t.Fatalf("key B: got %v, want nil", err)
	}
	if err := g.Check(context.Background(), keyB); err != nil {
		t.Fatalf("key B again: got %v, want nil", err)
	}
	select {
	case err := <-errA:
		t.Fatalf("key A answered %v before its check ended", err)
	default:
	}
	close(blockA)
	if err := <-errA; err != nil {
		t.Errorf("key A: got %v, want nil", err)
	}
	if a, b := f.callsOf(keyA), f.callsOf(keyB); a != 1 || b != 1 {
		t.Errorf("got %d checks of A and %d of B, want 1 each", a, b)
	}
}

func TestGateFailureReachesEveryWaiterAndIsNotCached(t *testing.T) {
	f := newFakeCheck()
	release := make(chan struct{})
	f.block[keyA] = release
	errFail := errors.New("seccomp-filter did not hold")
	f.fail[keyA] = errFail
	g := NewGate(f.check)
	const n = 3
	errs := checkConcurrently(g, keyA, n)
	close(release)
	for range n {
		if err := <-errs; !errors.Is(err, errFail) {
			t.Errorf("got %v, want the check's error", err)
		}
	}
	if got := f.callsOf(keyA); got != 1 {
		t.Errorf("got %d checks for %d waiters, want 1 shared", got, n)
	}
	// The next caller checks again: a failure is never remembered, and
	// never becomes a pass on its own.
	if err := g.Check(context.Background(), keyA); !errors.Is(err, errFail) {
		t.Errorf("second caller: got %v, want the check's error again", err)
	}
	f.mu.Lock()
	delete(f.fail, keyA)
	f.mu.Unlock()
	if err := g.Check(context.Background(), keyA); err != nil {
		t.Errorf("once the check passes: got %v, want nil", err)
	}
	if got := f.callsOf(keyA); got != 3 {
		t.Errorf("got %d checks, want 3 (one per failure, one pass)", got)
	}
}

func TestGatePanicFailsTheCheck(t *testing.T) {
	g := NewGate(func(context.Context, GateKey) error { panic("probe decoder") })
	if err := g.Check(context.Background(), keyA); err == nil {
		t.Fatal("got nil from a check that panicked, want an error")
	}
	if err := g.Check(context.Background(), keyA); err == nil {
		t.Fatal("second call: got nil, want an error")
	}
}

func TestGateCancellation(t *testing.T) {
	t.Run("last waiter cancels the check", func(t *testing.T) {
		f := newFakeCheck()
		f.block[keyA] = make(chan struct{}) // never released
		g := NewGate(f.check)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- g.Check(ctx, keyA) }()
		waitWaiters(g, keyA, 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
		if k := <-f.cancelled; k != keyA {
			t.Errorf("cancelled check of %v, want %v", k, keyA)
		}
		// Nothing was cached: the next caller runs a check of its own.
		f.mu.Lock()
		delete(f.block, keyA)
		f.mu.Unlock()
		if err := g.Check(context.Background(), keyA); err != nil {
			t.Errorf("after cancellation: got %v, want nil", err)
		}
		if got := f.callsOf(keyA); got != 2 {
			t.Errorf("got %d checks, want 2", got)
		}
	})
	t.Run("check goes on for the other waiters", func(t *testing.T) {
		f := newFakeCheck()
		release := make(chan struct{})
		f.block[keyA] = release
		g := NewGate(f.check)
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		stays := make(chan error, 1)
		go func() { gone <- g.Check(ctx, keyA) }()
		waitWaiters(g, keyA, 1)
		go func() { stays <- g.Check(context.Background(), keyA) }()
		waitWaiters(g, keyA, 2)
		cancel()
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled caller: got %v, want context.Canceled", err)
		}
		close(release)
		if err := <-stays; err != nil {
			t.Errorf("remaining caller: got %v, want nil", err)
		}
		select {
		case k := <-f.cancelled:
			t.Errorf("check of %v was cancelled while a caller still waited", k)
		default:
		}
		if got := f.callsOf(keyA); got != 1 {
			t.Errorf("got %d checks, want 1", got)
		}
	})
}
