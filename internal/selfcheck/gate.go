package selfcheck

import (
	"context"
	"fmt"
	"sync"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/sandbox"
)

// GateKey is what decides whether one selfcheck pass vouches for a job:
// the engine it runs on, its image and its runtime.
type GateKey struct {
	// Engine names the engine (its endpoint): a pass on one engine says
	// nothing about another.
	Engine string
	// Image is the local image ID the job runs in.
	Image string
	// Runtime is the job's runtime (sandbox.RuntimeRunc or RuntimeRunsc).
	Runtime string
}

// CheckFunc checks one key; nil means every isolation property held.
type CheckFunc func(ctx context.Context, k GateKey) error

// Gate runs the selfcheck once per key for the life of the process, before
// the first job of that key, while jobs of keys already checked (or being
// checked) go on. Concurrent first callers of one key share one check;
// callers of other keys never wait for it.
//
// A pass is remembered; a failure is not. Every caller waiting on a failed
// check gets its error, and the next job of that key checks again: a
// transient engine error must not refuse an image for the life of the
// daemon, and an image whose isolation does not hold fails again (one
// probe run per job, as before the gate existed). Nothing is cached on a
// failure, so a failed or cancelled check never lets a job through.
type Gate struct {
	check CheckFunc

	mu     sync.Mutex
	passed map[GateKey]bool
	// inflight are the checks running now, each shared by its waiters.
	inflight map[GateKey]*gateCheck
}

// gateCheck is one running check and the callers waiting for it.
type gateCheck struct {
	done    chan struct{} // closed when err is set
	err     error
	waiters int
	cancel  context.CancelFunc
}

// NewGate returns a gate that checks keys with check.
func NewGate(check CheckFunc) *Gate {
	return &Gate{check: check, passed: map[GateKey]bool{}, inflight: map[GateKey]*gateCheck{}}
}

// Check returns nil once k passed; otherwise it runs the check (or joins
// the one running for k) and returns its outcome. When ctx ends first,
// Check returns ctx's error; the shared check goes on while another caller
// waits for it and is cancelled when none does.
func (g *Gate) Check(ctx context.Context, k GateKey) error {
	g.mu.Lock()
	if g.passed[k] {
		g.mu.Unlock()
		return nil
	}
	c := g.inflight[k]
	if c == nil {
		// The check belongs to no single caller: it runs under a context
		// of its own, cancelled when the last waiter gives up.
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &gateCheck{done: make(chan struct{}), cancel: cancel}
		g.inflight[k] = c
		go g.run(cctx, k, c)
	}
	c.waiters++
	g.mu.Unlock()

	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		g.mu.Lock()
		c.waiters--
		if c.waiters == 0 && g.inflight[k] == c {
			// Nobody waits for it: stop it, and let the next caller
			// start afresh rather than join a check being cancelled.
			delete(g.inflight, k)
			c.cancel()
		}
		g.mu.Unlock()
		return fmt.Errorf("isolation selfcheck of image %s (%s): %w", k.Image, k.Runtime, context.Cause(ctx))
	}
}

func (g *Gate) run(ctx context.Context, k GateKey, c *gateCheck) {
	defer c.cancel()
	err := g.runCheck(ctx, k)
	g.mu.Lock()
	if err == nil {
		g.passed[k] = true
	}
	if g.inflight[k] == c {
		delete(g.inflight, k)
	}
	c.err = err
	close(c.done)
	g.mu.Unlock()
}

// runCheck turns a panic in the check into its failure: a gate whose
// check panicked must not let the job through, nor hang its waiters.
func (g *Gate) runCheck(ctx context.Context, k GateKey) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("isolation selfcheck of image %s (%s) panicked: %v", k.Image, k.Runtime, p)
		}
	}()
	return g.check(ctx, k)
}

// GatedBroker is a broker whose every job passes the gate first, for the
// job's own image and runtime: no job runs on an image before the probe
// has shown, in a sandbox of that image and runtime on this engine, that
// every isolation property holds. The daemon runs the check (Precheck)
// before it journals the job dispatched, not in the submit request (a slow
// check never makes a submission time out) and not after the dispatch (a
// crash during the check must leave the job accepted, to run after the
// restart); RunWithHooks checks again, at once once the key passed. A job
// whose check fails is refused before anything of it runs.
type GatedBroker struct {
	*broker.Broker
	Gate *Gate
	// Engine is the GateKey.Engine of every job (the broker's engine).
	Engine string
}

// Run runs a job once its key passed the gate.
func (g GatedBroker) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	return g.RunWithHooks(ctx, job, broker.Hooks{})
}

// Precheck passes the job's key through the gate: nil once its engine,
// image and runtime passed the selfcheck.
func (g GatedBroker) Precheck(ctx context.Context, job sandbox.Job) error {
	if err := g.Gate.Check(ctx, GateKey{Engine: g.Engine, Image: job.Image, Runtime: job.Runtime}); err != nil {
		return fmt.Errorf("isolation selfcheck on image %s did not pass; no job runs on it: %w", job.Image, err)
	}
	return nil
}

// RunWithHooks is broker.RunWithHooks once the job's key passed the gate.
func (g GatedBroker) RunWithHooks(ctx context.Context, job sandbox.Job, hooks broker.Hooks) (sandbox.Result, error) {
	if err := g.Precheck(ctx, job); err != nil {
		return sandbox.Result{}, err
	}
	return g.Broker.RunWithHooks(ctx, job, hooks)
}
