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
	"github.com/sandboxd/sandboxd/internal/selfcheck"
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
	patch                       string
	junit                       string
	json, ephemeralKey, quiet   bool
	maxBytes, maxFiles          int64
	parallel                    int
	engine                      *engineOptions
	cache                       *broker.CachePolicy
	runtime                     *runtimeFlag
}

// cmdRun evaluates one candidate against one bundle, end to end, with no
// daemon: state lives under the state directory.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, fs := runFlags(stderr)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if code := o.checkUsage(fs, stderr); code >= 0 {
		return code
	}
	r := &runInvocation{cmd: "sandboxd run", o: o, stdout: stdout, stderr: stderr}
	if code := r.checkOut(); code >= 0 {
		return code
	}
	r.rep = newReporter(stderr, o.quiet)
	signer, err := loadSigner(o.key)
	if err != nil {
		return r.bad("--key %s: %v", o.key, err)
	}
	s, err := openOneShot(ctx, o.engine, o.runtime.runsc())
	if err != nil {
		return r.infra("", err)
	}
	defer s.Close()
	// Last, after the verdict is printed and the evidence written.
	defer collectCaches(ctx, s.broker, s.leave, *o.cache, stderr, "sandboxd run")

	ev, code := r.evaluate(ctx, s, signer)
	if code >= 0 {
		return code
	}
	return r.report(ev)
}

// evaluated is what one evaluation of run (or of one instance of run-set)
// leaves: the bundle and workspace digests and the verified outcome.
type evaluated struct {
	bundleDigest, workspace string
	instance                string // the bundle's, "" for none
	outcome                 *evaluate.Outcome
}

// evaluate checks the bundle, ingests the workspace, checks isolation,
// runs the evaluation and writes its evidence and JUnit.
func (r *runInvocation) evaluate(ctx context.Context, s *sandboxes, signer *receipt.Signer) (evaluated, int) {
	bun, cleanup, code := r.openBundle(ctx, s)
	defer cleanup()
	if code >= 0 {
		return evaluated{}, code
	}
	ws, code := r.ingestWorkspace(ctx, s, bun)
	if code >= 0 {
		return evaluated{}, code
	}
	gated, code := r.checkIsolation(ctx, s, bun)
	if code >= 0 {
		return evaluated{}, code
	}
	outcome, code := r.runEvaluation(ctx, s, gated, signer, bun, ws)
	if code >= 0 {
		return evaluated{}, code
	}
	if code := r.writeOutputs(s, signer, bun, ws, outcome); code >= 0 {
		return evaluated{}, code
	}
	return evaluated{bundleDigest: bun.Digest, workspace: ws, instance: bun.Manifest.Instance, outcome: outcome}, -1
}

// runFlags declares the flags of `sandboxd run`.
func runFlags(stderr io.Writer) (*runOptions, *flag.FlagSet) {
	o := &runOptions{}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bundle, "bundle", "", "bundle directory (with bundle.json) or OCI layout `REF`")
	fs.StringVar(&o.workspace, "workspace", "", "candidate workspace `DIR` or tar file")
	fs.StringVar(&o.patch, "patch", "", "candidate unified diff `FILE`: the workspace is a directory holding only it, named "+patchName+" (for repository bundles, examples/repo-python)")
	addEvalFlags(fs, o)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd run --bundle DIR|LAYOUT --workspace DIR|TAR|--patch FILE --key FILE|--ephemeral-key [--out DIR] [--json] [--junit FILE] [--quiet] [--parallel N]")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "exit: 0 passed, 1 failed, 2 inconclusive, 3 bad input, 4 infrastructure error, 64 usage")
	}
	return o, fs
}

// addEvalFlags declares the flags `sandboxd run` and `sandboxd run-set`
// share: the signing key, the outputs, the workspace limits, the engine.
func addEvalFlags(fs *flag.FlagSet, o *runOptions) {
	fs.StringVar(&o.key, "key", "", "broker signing key `FILE` (password in SANDBOXD_KEY_PASSWORD)")
	fs.BoolVar(&o.ephemeralKey, "ephemeral-key", false, "sign with a key generated for this run (every envelope records it as ephemeral)")
	fs.StringVar(&o.out, "out", "", "write the evidence directory to `DIR` (must not exist or be empty)")
	fs.BoolVar(&o.json, "json", false, "print the assessment as JSON instead of a table")
	fs.StringVar(&o.junit, "junit", "", "also write the assessment as JUnit XML to `FILE` (replaced atomically)")
	fs.BoolVar(&o.quiet, "quiet", false, "print no progress on stderr")
	fs.Int64Var(&o.maxBytes, "workspace-max-bytes", bundle.DefaultLimits().MaxBytes, "ceiling on the workspace's file bytes")
	fs.Int64Var(&o.maxFiles, "workspace-max-files", bundle.DefaultLimits().MaxFiles, "ceiling on the workspace's files and directories")
	fs.IntVar(&o.parallel, "parallel", 0, "run the jobs of at most `N` workspaces (each control's, the candidate's) at once; 0 is all of them")
	o.engine = addEngineFlags(fs)
	o.cache = addCacheFlags(fs)
	o.runtime = addRuntimeFlag(fs, "runtime every job of the evaluation runs on: runc or runsc (gVisor)")
}

// checkUsage refuses what the flags cannot mean together (exitUsage).
func (o *runOptions) checkUsage(fs *flag.FlagSet, stderr io.Writer) int {
	if o.bundle == "" || (o.workspace == "") == (o.patch == "") || fs.NArg() != 0 {
		if o.workspace != "" && o.patch != "" {
			fmt.Fprintln(stderr, "sandboxd run: give one of --workspace and --patch")
		}
		fs.Usage()
		return exitUsage
	}
	return o.checkEvalUsage("sandboxd run", stderr)
}

// checkEvalUsage refuses what the shared flags cannot mean (exitUsage).
func (o *runOptions) checkEvalUsage(cmd string, stderr io.Writer) int {
	if (o.key == "") == !o.ephemeralKey {
		// Evidence signed by a key nobody can pin must be asked for.
		fmt.Fprintln(stderr, cmd+": give exactly one of --key FILE and --ephemeral-key")
		return exitUsage
	}
	if err := o.cache.Validate(); err != nil {
		fmt.Fprintln(stderr, cmd+": --volume-budget:", err)
		return exitUsage
	}
	if o.parallel < 0 {
		fmt.Fprintf(stderr, "%s: --parallel %d: want 0 (all at once) or more\n", cmd, o.parallel)
		return exitUsage
	}
	return -1
}

// runInvocation is one `sandboxd run` under way. Each of its steps says on stderr
// why the command stops and returns its exit code, or -1 to go on.
type runInvocation struct {
	cmd            string // the prefix of what it prints: "sandboxd run", or none for an instance of a set
	instance       string // for an instance of a set, its name, which the bundle's instance (if any) must be
	o              *runOptions
	stdout, stderr io.Writer
	rep            progress.Reporter
}

// say prints a line on stderr, after the command's name if it has one.
func (r *runInvocation) say(msg string) {
	if r.cmd != "" {
		msg = r.cmd + ": " + msg
	}
	fmt.Fprintln(r.stderr, msg)
}

// bad says why an input was refused: exitBadInput.
func (r *runInvocation) bad(format string, a ...any) int {
	r.say(fmt.Sprintf(format, a...))
	return exitBadInput
}

// infra says what failed on the engine or the host: exitInfraError.
func (r *runInvocation) infra(what string, err error) int {
	if what == "" {
		r.say(err.Error())
	} else {
		r.say(what + ": " + err.Error())
	}
	return exitInfraError
}

// checkOut refuses an --out directory that has files in it already.
func (r *runInvocation) checkOut() int {
	if r.o.out == "" {
		return -1
	}
	if ents, err := os.ReadDir(r.o.out); err == nil && len(ents) > 0 {
		return r.bad("--out %s: directory is not empty; evidence is never mixed with other files", r.o.out)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return r.bad("--out %s: %v", r.o.out, err)
	}
	return -1
}

// openBundle opens and verifies the bundle and copies its layer into the
// blob store. cleanup is never nil.
func (r *runInvocation) openBundle(ctx context.Context, s *sandboxes) (bun *bundle.Bundle, cleanup func(), code int) {
	step := progress.Start(r.rep, "checking bundle "+r.o.bundle)
	bun, cleanup, err := bundle.OpenRef(ctx, r.o.bundle, filepath.Join(s.state, "tmp"))
	if err == nil {
		err = bun.Verify(ctx)
		if err != nil {
			err = fmt.Errorf("does not verify: %w", err)
		}
	}
	endStep(step, err)
	if err != nil {
		return nil, cleanup, r.bad("bundle %s: %v", r.o.bundle, err)
	}
	if got := bun.Manifest.Instance; r.instance != "" && got != "" && got != r.instance {
		return nil, cleanup, r.bad("bundle %s names instance %q, not %q", r.o.bundle, got, r.instance)
	}
	if err := bun.CopyLayer(s.blobs); err != nil {
		return nil, cleanup, r.bad("bundle %s: %v", r.o.bundle, err)
	}
	return bun, cleanup, -1
}

// ingestWorkspace reads the candidate workspace into the blob store under
// the workspace limits and the bundle's refusals, and returns its digest.
func (r *runInvocation) ingestWorkspace(ctx context.Context, s *sandboxes, bun *bundle.Bundle) (digest string, code int) {
	lim := bundle.DefaultLimits()
	lim.MaxBytes, lim.MaxFiles = r.o.maxBytes, r.o.maxFiles
	if err := lim.Validate(); err != nil {
		return "", r.bad("%v", err)
	}
	src := r.o.workspace
	if r.o.patch != "" {
		dir, err := patchWorkspace(r.o.patch, filepath.Join(s.state, "tmp"), lim.MaxBytes)
		if err != nil {
			return "", r.bad("--patch %s: %v", r.o.patch, err)
		}
		defer os.RemoveAll(dir)
		src = dir
	}
	step := progress.Start(r.rep, "ingesting workspace "+r.o.workspace+r.o.patch)
	ws, err := bundle.Ingest(ctx, s.blobs, src, bundle.Options{Limits: lim, Refuse: bun.Manifest.Refused(), Progress: func(n int64) { step.Update("reading", n, -1) }})
	endStep(step, err)
	if err != nil {
		return "", r.bad("workspace %s: %v", r.o.workspace+r.o.patch, err)
	}
	return ws.Digest, -1
}

// patchName is the file a --patch workspace holds: the name repository
// bundles read the candidate's unified diff from.
const patchName = "candidate.patch"

// patchWorkspace makes a workspace holding only the file at path, named
// patchName, in a new directory below tmp, and returns that directory.
// The file must be a regular file of at most maxBytes bytes.
func patchWorkspace(path, tmp string, maxBytes int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return "", err
	} else if !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(tmp, "patch-")
	if err != nil {
		return "", err
	}
	// Streamed, never held whole: a --patch may be as large as a workspace.
	if err := copyAtMost(filepath.Join(dir, patchName), f, maxBytes); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// copyAtMost writes what r holds to a new file at path, refusing more than
// maxBytes.
func copyAtMost(path string, r io.Reader, maxBytes int64) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(r, maxBytes+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return err
	case n > maxBytes:
		return fmt.Errorf("larger than --workspace-max-bytes (%d)", maxBytes)
	}
	return nil
}

// checkIsolation returns the gated broker once the isolation properties
// hold. No job runs on an engine where they do not (cached per engine,
// profile, image, runtime and probe), for the image and runtime of each job
// the evaluation builds; the broker the evaluation runs them on checks each
// job's own key again.
func (r *runInvocation) checkIsolation(ctx context.Context, s *sandboxes, bun *bundle.Bundle) (selfcheck.GatedBroker, int) {
	step := progress.Start(r.rep, "checking isolation on this engine (selfcheck)")
	gated := s.gated()
	e, err := evaluate.Of(bun, string(*r.o.runtime))
	if err != nil {
		endStep(step, err)
		return gated, r.bad("bundle %s: %v", r.o.bundle, err)
	}
	jobs := []sandbox.Job{e.GraderTemplate("")}
	if e.HasCandidate() { // a bundle without a candidate command runs no candidate job
		jobs = append(jobs, e.CandidateJob("", ""))
	}
	for _, job := range jobs {
		if err := gated.Precheck(ctx, job); err != nil {
			endStep(step, err)
			if errors.Is(err, sandbox.ErrImageRefused) {
				return gated, r.bad("bundle %s: evaluator image %s: %v", r.o.bundle, bun.Manifest.Image, err)
			}
			return gated, r.infra("selfcheck", err)
		}
	}
	step.End("done")
	return gated, -1
}

// runEvaluation runs the evaluation: candidate, grader, controls, assessment.
func (r *runInvocation) runEvaluation(ctx context.Context, s *sandboxes, gated selfcheck.GatedBroker, signer *receipt.Signer, bun *bundle.Bundle, ws string) (*evaluate.Outcome, int) {
	sstore, err := supervisor.NewDirStore(filepath.Join(s.state, "assessments"))
	if err != nil {
		return nil, r.infra("", err)
	}
	outcome, err := evaluate.Run(ctx, evaluate.Deps{
		Broker: reportingBroker{gated, r.rep}, Blobs: s.blobs, Signer: signer, Supervisor: supervisor.New(sstore), Progress: r.rep,
		Parallel: r.o.parallel,
	}, evaluate.Request{Bundle: bun, WorkspaceDigest: ws, Runtime: string(*r.o.runtime)})
	switch {
	case err == nil:
		return outcome, -1
	case errors.Is(err, evaluate.ErrCandidateExport):
		// The candidate's doing: no verdict can be reached, which is
		// inconclusive, never the caller's bad input.
		r.say("inconclusive: " + err.Error())
		return nil, exitInconclusive
	case errors.Is(err, sandbox.ErrImageRefused):
		return nil, r.bad("bundle %s: evaluator image %s: %v", r.o.bundle, bun.Manifest.Image, err)
	case errors.Is(err, sandbox.ErrInvalid):
		return nil, r.bad("%v", err)
	}
	return nil, r.infra("", err)
}

// writeOutputs writes the evidence directory (--out) and the JUnit XML
// (--junit), the latter from the assessment the evaluation verified, never
// from a log.
func (r *runInvocation) writeOutputs(s *sandboxes, signer *receipt.Signer, bun *bundle.Bundle, ws string, outcome *evaluate.Outcome) int {
	if r.o.out != "" {
		step := progress.Start(r.rep, "writing evidence to "+r.o.out)
		err := evidence.Write(r.o.out, s.blobs, signer, bun, ws, outcome)
		endStep(step, err)
		if err != nil {
			return r.infra("evidence", err)
		}
	}
	if r.o.junit != "" {
		if err := writeJUnit(r.o.junit, outcome.AssessmentJSON); err != nil {
			return r.infra("--junit", err)
		}
	}
	return -1
}

// report prints the assessment and returns the verdict's exit code, or
// exitInfraError when a job ended with the sandbox failing.
func (r *runInvocation) report(ev evaluated) int {
	if r.o.json {
		r.stdout.Write(ev.outcome.AssessmentJSON)
		fmt.Fprintln(r.stdout)
	} else {
		printVerdict(r.stdout, ev)
	}
	if j, ok := sandboxFailure(ev.outcome); ok {
		r.say(fmt.Sprintf("%s job %s ended %s: %s", j.Role, j.Job.ID, j.Result.Status, j.Result.Cause))
		return exitInfraError
	}
	return verdictCode(ev.outcome.Assessment.Verdict)
}

// sandboxFailure returns the first job of the evaluation that ended with
// the sandbox failing (error or uncertain), which no verdict may hide.
func sandboxFailure(o *evaluate.Outcome) (evaluate.JobRecord, bool) {
	for _, j := range o.Jobs {
		if j.Result.Status == sandbox.StatusError || j.Result.Status == sandbox.StatusUncertain {
			return j, true
		}
	}
	return evaluate.JobRecord{}, false
}

// verdictCode is run's exit code for a verdict.
func verdictCode(v supervisor.Verdict) int {
	switch v {
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

func printVerdict(w io.Writer, ev evaluated) {
	o := ev.outcome
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
	inst := ""
	if ev.instance != "" {
		inst = " instance " + ev.instance
	}
	fmt.Fprintf(w, "verdict: %s (%d passed, %d failed, %d inconclusive)%s bundle %s workspace %s%s\n",
		a.Verdict, counts[supervisor.Passed], counts[supervisor.Failed], counts[supervisor.Inconclusive], inst, short(ev.bundleDigest), short(ev.workspace), reason)
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}
