package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/evidence"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Exit codes of `sandboxd run` (documented in README.md): the verdict, or
// why there is none.
const (
	exitPassed       = 0
	exitVerdictFail  = 1
	exitInconclusive = 2
	// exitBadInput (3) and exitInfraError (4) are shared with every command.
)

type runOptions struct {
	bundle, workspace, key, out string
	junit                       string
	json, ephemeralKey, quiet   bool
	maxBytes, maxFiles          int64
}

// cmdRun evaluates one candidate against one bundle, end to end, with no
// daemon: state lives under the state directory.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o runOptions
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bundle, "bundle", "", "bundle directory (with bundle.json) or OCI layout `REF`")
	fs.StringVar(&o.workspace, "workspace", "", "candidate workspace `DIR` or tar file")
	fs.StringVar(&o.key, "key", "", "broker signing key `FILE` (password in SANDBOXD_KEY_PASSWORD)")
	fs.BoolVar(&o.ephemeralKey, "ephemeral-key", false, "sign with a key generated for this run (every envelope records it as ephemeral)")
	fs.StringVar(&o.out, "out", "", "write the evidence directory to `DIR` (must not exist or be empty)")
	fs.BoolVar(&o.json, "json", false, "print the assessment as JSON instead of a table")
	fs.StringVar(&o.junit, "junit", "", "also write the assessment as JUnit XML to `FILE` (replaced atomically)")
	fs.BoolVar(&o.quiet, "quiet", false, "print no progress on stderr")
	fs.Int64Var(&o.maxBytes, "workspace-max-bytes", bundle.DefaultLimits().MaxBytes, "ceiling on the workspace's file bytes")
	fs.Int64Var(&o.maxFiles, "workspace-max-files", bundle.DefaultLimits().MaxFiles, "ceiling on the workspace's files and directories")
	eo := addEngineFlags(fs)
	cache := addCacheFlags(fs)
	rt := fs.String("runtime", sandbox.RuntimeRunc, "runtime every job of the evaluation runs on: runc or runsc (gVisor)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd run --bundle DIR|LAYOUT --workspace DIR|TAR --key FILE|--ephemeral-key [--out DIR] [--json] [--junit FILE] [--quiet]")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "exit: 0 passed, 1 failed, 2 inconclusive, 3 bad input, 4 infrastructure error, 64 usage")
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if o.bundle == "" || o.workspace == "" || fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	if (o.key == "") == !o.ephemeralKey {
		// Evidence signed by a key nobody can pin must be asked for.
		fmt.Fprintln(stderr, "sandboxd run: give exactly one of --key FILE and --ephemeral-key")
		return exitUsage
	}
	if err := cache.Validate(); err != nil {
		fmt.Fprintln(stderr, "sandboxd run: --volume-budget:", err)
		return exitUsage
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sandboxd run: "+format+"\n", a...)
		return exitBadInput
	}
	if o.out != "" {
		if ents, err := os.ReadDir(o.out); err == nil && len(ents) > 0 {
			return bad("--out %s: directory is not empty; evidence is never mixed with other files", o.out)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return bad("--out %s: %v", o.out, err)
		}
	}
	rep := newReporter(stderr, o.quiet)

	signer, err := loadSigner(o.key)
	if err != nil {
		return bad("--key %s: %v", o.key, err)
	}
	eng, err := broker.NewEngine()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd run: engine:", err)
		return exitInfraError
	}
	defer eng.Close()
	if *rt != sandbox.RuntimeRunc && *rt != sandbox.RuntimeRunsc {
		return bad("--runtime %q is not runc or runsc", *rt)
	}
	runsc := *rt == sandbox.RuntimeRunsc
	beng, closeEng, err := eo.open(ctx, eng, runsc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd run: engine:", err)
		return exitInfraError
	}
	defer closeEng.Close()
	b, blobs, leave, err := newBrokerAllowing(beng, runsc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd run:", err)
		return exitInfraError
	}
	// Last, after the verdict is printed and the evidence written.
	defer collectCaches(ctx, b, leave, *cache, stderr, "sandboxd run")
	state, _ := stateDir()

	step := progress.Start(rep, "checking bundle "+o.bundle)
	bun, cleanup, err := bundle.OpenRef(ctx, o.bundle, filepath.Join(state, "tmp"))
	defer cleanup()
	if err == nil {
		err = bun.Verify(ctx)
		if err != nil {
			err = fmt.Errorf("does not verify: %w", err)
		}
	}
	endStep(step, err)
	if err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}
	if err := bun.CopyLayer(blobs); err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}
	lim := bundle.DefaultLimits()
	lim.MaxBytes, lim.MaxFiles = o.maxBytes, o.maxFiles
	if err := lim.Validate(); err != nil {
		return bad("%v", err)
	}
	step = progress.Start(rep, "ingesting workspace "+o.workspace)
	ws, err := bundle.Ingest(ctx, blobs, o.workspace, bundle.Options{Limits: lim, Refuse: bun.Manifest.Refused(), Progress: func(n int64) { step.Update("reading", n, -1) }})
	endStep(step, err)
	if err != nil {
		return bad("workspace %s: %v", o.workspace, err)
	}
	// No job runs on an engine where the isolation properties do not hold
	// (cached per engine, profile, image, runtime and probe), for the image
	// and runtime of each job the evaluation builds; the broker the
	// evaluation runs them on checks each job's own key again.
	step = progress.Start(rep, "checking isolation on this engine (selfcheck)")
	gated := gatedBroker(beng, b, blobs, state)
	jobs := []sandbox.Job{evaluate.GraderJob(bun.Manifest, "", "", "", "", *rt)}
	if bun.Manifest.Candidate != nil { // a bundle without a candidate command runs no candidate job
		jobs = append(jobs, evaluate.CandidateJob(bun.Manifest, "", "", "", *rt))
	}
	for _, job := range jobs {
		if err := gated.Precheck(ctx, job); err != nil {
			endStep(step, err)
			if errors.Is(err, sandbox.ErrImageRefused) {
				return bad("bundle %s: evaluator image %s: %v", o.bundle, bun.Manifest.Image, err)
			}
			fmt.Fprintln(stderr, "sandboxd run: selfcheck:", err)
			return exitInfraError
		}
	}
	step.End("done")
	sstore, err := supervisor.NewDirStore(filepath.Join(state, "assessments"))
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd run:", err)
		return exitInfraError
	}
	outcome, err := evaluate.Run(ctx, evaluate.Deps{
		Broker: reportingBroker{gated, rep}, Blobs: blobs, Signer: signer, Supervisor: supervisor.New(sstore), Progress: rep,
	}, evaluate.Request{Bundle: bun, WorkspaceDigest: ws.Digest, Runtime: *rt})
	switch {
	case err == nil:
	case errors.Is(err, evaluate.ErrCandidateExport):
		// The candidate's doing: no verdict can be reached, which is
		// inconclusive, never the caller's bad input.
		fmt.Fprintln(stderr, "sandboxd run: inconclusive:", err)
		return exitInconclusive
	case errors.Is(err, sandbox.ErrImageRefused):
		return bad("bundle %s: evaluator image %s: %v", o.bundle, bun.Manifest.Image, err)
	case errors.Is(err, sandbox.ErrInvalid):
		return bad("%v", err)
	default:
		fmt.Fprintln(stderr, "sandboxd run:", err)
		return exitInfraError
	}
	if o.out != "" {
		step = progress.Start(rep, "writing evidence to "+o.out)
		err := evidence.Write(o.out, blobs, signer, bun, ws.Digest, outcome)
		endStep(step, err)
		if err != nil {
			fmt.Fprintln(stderr, "sandboxd run: evidence:", err)
			return exitInfraError
		}
	}
	if o.junit != "" {
		// From the assessment the evaluation verified, never from a log.
		if err := writeJUnit(o.junit, outcome.AssessmentJSON); err != nil {
			fmt.Fprintln(stderr, "sandboxd run: --junit:", err)
			return exitInfraError
		}
	}
	if o.json {
		stdout.Write(outcome.AssessmentJSON)
		fmt.Fprintln(stdout)
	} else {
		printVerdict(stdout, bun, ws.Digest, outcome)
	}
	for _, j := range outcome.Jobs {
		if j.Result.Status == sandbox.StatusError || j.Result.Status == sandbox.StatusUncertain {
			fmt.Fprintf(stderr, "sandboxd run: %s job %s ended %s: %s\n", j.Role, j.Job.ID, j.Result.Status, j.Result.Cause)
			return exitInfraError
		}
	}
	switch outcome.Assessment.Verdict {
	case supervisor.Passed:
		return exitPassed
	case supervisor.Failed:
		return exitVerdictFail
	}
	return exitInconclusive
}

func loadSigner(path string) (*receipt.Signer, error) {
	if path == "" {
		return receipt.NewEphemeralSigner()
	}
	return receipt.LoadSigner(path, []byte(os.Getenv("SANDBOXD_KEY_PASSWORD")))
}

func printVerdict(w io.Writer, b *bundle.Bundle, ws string, o *evaluate.Outcome) {
	a := o.Assessment
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tREASON")
	for _, c := range a.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Reason)
	}
	for _, c := range o.Controls {
		fmt.Fprintf(tw, "control %s\t%s\t%s\n", c.Kind, c.Assessment.Verdict, strings.Join(c.Assessment.Reasons, "; "))
	}
	tw.Flush()
	counts := map[supervisor.Verdict]int{}
	for _, c := range a.Checks {
		counts[c.Status]++
	}
	reason := ""
	if len(a.Reasons) > 0 && a.Verdict != supervisor.Passed {
		reason = " — " + strings.Join(a.Reasons, "; ")
	}
	fmt.Fprintf(w, "verdict: %s (%d passed, %d failed, %d inconclusive) bundle %s workspace %s%s\n",
		a.Verdict, counts[supervisor.Passed], counts[supervisor.Failed], counts[supervisor.Inconclusive], short(b.Digest), short(ws), reason)
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}
