package main

import (
	"context"
	"io"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/sandbox"
)

// newReporter is the progress of a command on stderr: an updating line on
// a terminal, plain lines otherwise, nothing with --quiet. Progress never
// goes to stdout.
func newReporter(stderr io.Writer, quiet bool) progress.Reporter {
	if quiet {
		return nil
	}
	return progress.New(stderr, progress.Options{Terminal: progress.IsTerminal(stderr)})
}

// reportingBroker is the broker with each job one progress step: its
// staging, run and collection through the broker's hooks, then its end.
type reportingBroker struct {
	hookedBroker
	rep progress.Reporter
}

// hookedBroker is the broker as run uses it (selfcheck.GatedBroker).
type hookedBroker interface {
	Facts(ctx context.Context) (sandbox.RuntimeFacts, error)
	RunWithHooks(ctx context.Context, job sandbox.Job, hooks broker.Hooks) (sandbox.Result, error)
}

func (b reportingBroker) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	step := progress.Start(b.rep, "job "+job.ID)
	res, err := b.RunWithHooks(ctx, job, broker.Hooks{OnProgress: step.Update})
	if err != nil {
		step.End("failed")
		return res, err
	}
	step.End(string(res.Status))
	return res, nil
}

// endStep ends a step of a command by its error.
func endStep(step progress.Step, err error) {
	if err != nil {
		step.End("failed")
		return
	}
	step.End("done")
}
