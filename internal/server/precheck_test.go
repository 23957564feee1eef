package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
)

// precheckingBroker is the fake broker behind a gate (as the selfcheck's
// GatedBroker): Precheck records the journal state of the job when the
// check begins, then waits for release (or the job's context) and answers
// fail. ran is closed when the broker is asked to run the job.
type precheckingBroker struct {
	*fakeBroker
	jr      *journal.Journal
	entered chan journal.State
	release chan struct{}
	fail    error
	ran     chan struct{}
	once    sync.Once
}

func (p *precheckingBroker) RunWithHooks(ctx context.Context, job sandbox.Job, h broker.Hooks) (sandbox.Result, error) {
	p.once.Do(func() { close(p.ran) })
	return p.fakeBroker.RunWithHooks(ctx, job, h)
}

func newPrechecking(fail error) *precheckingBroker {
	return &precheckingBroker{fakeBroker: newFake(), entered: make(chan journal.State, 1), release: make(chan struct{}), fail: fail, ran: make(chan struct{})}
}

func (p *precheckingBroker) Precheck(ctx context.Context, job sandbox.Job) error {
	rec, err := p.jr.Get(job.ID)
	if err != nil {
		return err
	}
	p.entered <- rec.State
	select {
	case <-p.release:
		return p.fail
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// submitGated starts a daemon on b and submits one job to it.
func submitGated(t *testing.T, b Broker) (*fixture, sandbox.Job) {
	t.Helper()
	f := newFixture(t, func(cfg *Config) {
		if pb, ok := b.(*precheckingBroker); ok {
			pb.jr = cfg.Journal
		}
		cfg.Broker = b
	}, nil)
	job := newJob(t, "gated", "true")
	if code, _, _ := f.submit(t, job); code != 202 {
		t.Fatalf("submit: got %d, want 202", code)
	}
	return f, job
}

// The gate runs before the dispatch is journaled: a daemon killed while
// the check runs leaves the job accepted (run after the restart), not
// dispatched with no container (ended uncertain, never run). A failed
// check ends the job error, never run.
func TestPrecheckRunsBeforeDispatch(t *testing.T) {
	for _, c := range []struct {
		name string
		fail error
		want sandbox.Status
		runs int
	}{
		{"passed: runs once", nil, sandbox.StatusSucceeded, 1},
		{"failed: error, never run", errors.New("selfcheck: the seccomp property did not hold"), sandbox.StatusError, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			pb := newPrechecking(c.fail)
			f, job := submitGated(t, pb)
			select {
			case st := <-pb.entered:
				if st != journal.Accepted {
					t.Errorf("journal state while the check runs: got %s, want %s", st, journal.Accepted)
				}
			case <-pb.ran:
				t.Fatal("the broker ran the job before it was checked")
			}
			close(pb.release)
			v := f.wait(t, job.ID)
			if v.Status != c.want {
				t.Errorf("got status %s, want %s", v.Status, c.want)
			}
			pb.mu.Lock()
			runs := pb.runs[job.ID]
			pb.mu.Unlock()
			if runs != c.runs {
				t.Errorf("broker ran the job %d times, want %d", runs, c.runs)
			}
		})
	}
}

// refusingOnCancelBroker is the fake broker whose run waits (as for a gate)
// until the job's context ends, then refuses the job before anything of it
// ran.
type refusingOnCancelBroker struct {
	*fakeBroker
	entered chan journal.State
}

func (r *refusingOnCancelBroker) RunWithHooks(ctx context.Context, job sandbox.Job, _ broker.Hooks) (sandbox.Result, error) {
	r.entered <- journal.Dispatched
	<-ctx.Done()
	return sandbox.Result{}, fmt.Errorf("isolation selfcheck on image %s did not pass: %w", job.Image, context.Cause(ctx))
}

// A job cancelled through the API while it waits on the gate, before it
// ran, ends cancelled: not error, which would blame the infrastructure.
func TestCancelWhileGatedEndsCancelled(t *testing.T) {
	for _, c := range []struct {
		name string
		b    func() (Broker, chan journal.State)
	}{
		{"in the precheck", func() (Broker, chan journal.State) {
			pb := newPrechecking(nil)
			return pb, pb.entered
		}},
		{"in the broker, before it ran", func() (Broker, chan journal.State) {
			rb := &refusingOnCancelBroker{fakeBroker: newFake(), entered: make(chan journal.State, 1)}
			return rb, rb.entered
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, entered := c.b()
			f, job := submitGated(t, b)
			<-entered
			if resp, body := f.do(t, "POST", "/v1/jobs/"+job.ID+"/cancel", nil); resp.StatusCode != 202 {
				t.Fatalf("cancel: got %d %s, want 202", resp.StatusCode, body)
			}
			if v := f.wait(t, job.ID); v.Status != sandbox.StatusCancelled {
				t.Errorf("got status %s, want %s", v.Status, sandbox.StatusCancelled)
			}
		})
	}
}
