package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/junitreport"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// maxSetFileBytes bounds a set or predictions file: predictions hold their
// patches inline.
const maxSetFileBytes = 256 << 20

// setOptions are run-set's own flags beside those it shares with run.
type setOptions struct {
	set, predictions, bundles string
	concurrency               int
}

// setEntry is one instance of a set: a bundle and a candidate (a patch
// file, a workspace, or a patch given inline by a predictions file).
type setEntry struct {
	Instance  string `json:"instance"`
	Bundle    string `json:"bundle"`
	Patch     string `json:"patch,omitempty"`
	Workspace string `json:"workspace,omitempty"`
	patchText *string
}

// setOutcome is what became of one instance: its summary line in --json.
type setOutcome struct {
	Instance        string             `json:"instance"`
	Bundle          string             `json:"bundle"`
	BundleDigest    string             `json:"bundle_digest,omitempty"`
	WorkspaceDigest string             `json:"workspace_digest,omitempty"`
	Verdict         supervisor.Verdict `json:"verdict,omitempty"`
	ExitCode        int                `json:"exit_code"`
	Error           string             `json:"error,omitempty"`
	DurationMS      int64              `json:"duration_ms"`
	Assessment      json.RawMessage    `json:"assessment,omitempty"`
	assessment      *supervisor.Assessment
}

// setSummary is run-set's --json output.
type setSummary struct {
	Schema    string         `json:"schema"`
	Counts    map[string]int `json:"counts"`
	Instances []setOutcome   `json:"instances"`
}

// cmdRunSet evaluates the instances of a set (a dataset of bundles and
// candidates) on one broker, a bounded number at once, and reports them
// together: a table or JSON on stdout, one JUnit file, an evidence
// directory per instance. The whole set is read and checked before
// anything runs.
func cmdRunSet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, so, fs := runSetFlags(stderr)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if code := so.checkUsage(o, fs, stderr); code >= 0 {
		return code
	}
	const cmd = "sandboxd run-set"
	entries, err := so.read(o.maxBytes)
	if err != nil {
		fmt.Fprintln(stderr, cmd+":", err)
		return exitBadInput
	}
	r := &runInvocation{cmd: cmd, o: o, stdout: stdout, stderr: stderr}
	if code := r.checkOut(); code >= 0 {
		return code
	}
	signer, err := loadSigner(o.key)
	if err != nil {
		return r.bad("--key %s: %v", o.key, err)
	}
	s, err := openOneShot(ctx, o.engine, o.runtime.runsc())
	if err != nil {
		return r.infra("", err)
	}
	defer s.Close()
	defer collectCaches(ctx, s.broker, s.leave, *o.cache, stderr, cmd)

	outcomes := runInstances(ctx, s, signer, o, entries, so.concurrency, newSetProgress(stderr, o.quiet, len(entries)))
	return reportSet(stdout, stderr, o, outcomes)
}

// runSetFlags declares the flags of `sandboxd run-set`.
func runSetFlags(stderr io.Writer) (*runOptions, *setOptions, *flag.FlagSet) {
	o, so := &runOptions{}, &setOptions{}
	fs := flag.NewFlagSet("run-set", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&so.set, "set", "", "the set: JSON Lines `FILE`, one {\"instance\", \"bundle\", \"patch\" or \"workspace\"} per line, paths relative to the file")
	fs.StringVar(&so.predictions, "predictions", "", "SWE-bench predictions `FILE` (JSON Lines or a JSON array of {\"instance_id\", \"model_patch\"}), with --bundles")
	fs.StringVar(&so.bundles, "bundles", "", "with --predictions: `DIR` holding one bundle per instance, named by its id")
	fs.IntVar(&so.concurrency, "concurrency", 2, "evaluate at most `N` instances at once")
	addEvalFlags(fs, o)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd run-set --set FILE|--predictions FILE --bundles DIR --key FILE|--ephemeral-key [--concurrency N] [--out DIR] [--json] [--junit FILE] [--quiet] [--parallel N]")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "exit: the worst of the instances': 0 all passed, 1 failed, 2 inconclusive, 3 bad input, 4 infrastructure error; 3 with nothing run when the set itself is refused; 64 usage")
	}
	return o, so, fs
}

// checkUsage refuses what the flags cannot mean together (exitUsage).
func (so *setOptions) checkUsage(o *runOptions, fs *flag.FlagSet, stderr io.Writer) int {
	if fs.NArg() != 0 || (so.set == "") == (so.predictions == "") || (so.predictions == "") != (so.bundles == "") {
		fmt.Fprintln(stderr, "sandboxd run-set: give --set FILE, or --predictions FILE with --bundles DIR")
		fs.Usage()
		return exitUsage
	}
	if so.concurrency < 1 {
		fmt.Fprintf(stderr, "sandboxd run-set: --concurrency %d: want 1 or more\n", so.concurrency)
		return exitUsage
	}
	return o.checkEvalUsage("sandboxd run-set", stderr)
}

// read reads and checks the whole set: every line decodes, names a unique
// instance, a bundle that is there and one candidate that is there.
func (so *setOptions) read(maxPatch int64) ([]setEntry, error) {
	path := so.set
	if path == "" {
		path = so.predictions
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var entries []setEntry
	if so.set != "" {
		entries, err = decodeSet(f, filepath.Dir(path))
	} else {
		entries, err = decodePredictions(f, so.bundles)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s: no instances", path)
	}
	seen := map[string]bool{}
	for i, e := range entries {
		if err := e.check(maxPatch); err != nil {
			return nil, fmt.Errorf("%s: instance %d (%q): %w", path, i+1, e.Instance, err)
		}
		if seen[e.Instance] {
			return nil, fmt.Errorf("%s: instance %d: %q is named twice", path, i+1, e.Instance)
		}
		seen[e.Instance] = true
	}
	return entries, nil
}

// decodeSet reads a set file: JSON Lines of setEntry, unknown fields
// refused; relative paths are relative to dir.
func decodeSet(r io.Reader, dir string) ([]setEntry, error) {
	var entries []setEntry
	sc := bufio.NewScanner(io.LimitReader(r, maxSetFileBytes))
	sc.Buffer(nil, maxSetFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e setEntry
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("line %d: more than one JSON value", n)
		}
		for _, p := range []*string{&e.Bundle, &e.Patch, &e.Workspace} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// prediction is a line of a SWE-bench predictions file; its other fields
// (model_name_or_path, …) are not read.
type prediction struct {
	InstanceID string  `json:"instance_id"`
	ModelPatch *string `json:"model_patch"`
}

// decodePredictions reads a SWE-bench predictions file, JSON Lines or one
// JSON array; the bundle of instance X is bundles/X.
func decodePredictions(r io.Reader, bundles string) ([]setEntry, error) {
	br := bufio.NewReader(io.LimitReader(r, maxSetFileBytes))
	dec := json.NewDecoder(br)
	var preds []prediction
	if first, err := firstNonSpace(br); err != nil {
		return nil, err
	} else if first == '[' {
		if err := dec.Decode(&preds); err != nil {
			return nil, err
		}
		if dec.More() {
			return nil, errors.New("more than one JSON value after the array")
		}
	} else {
		for n := 1; ; n++ {
			var p prediction
			if err := dec.Decode(&p); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("prediction %d: %v", n, err)
			}
			preds = append(preds, p)
		}
	}
	entries := make([]setEntry, 0, len(preds))
	for i, p := range preds {
		if p.ModelPatch == nil {
			return nil, fmt.Errorf("prediction %d (%q): no model_patch", i+1, p.InstanceID)
		}
		entries = append(entries, setEntry{Instance: p.InstanceID, Bundle: filepath.Join(bundles, p.InstanceID), patchText: p.ModelPatch})
	}
	return entries, nil
}

func firstNonSpace(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		if !strings.ContainsRune(" \t\r\n", rune(b)) {
			return b, br.UnreadByte()
		}
	}
}

// check refuses an entry whose name, bundle or candidate is not usable.
func (e setEntry) check(maxPatch int64) error {
	// An instance id (sandbox.ValidInstance) is one path element: it
	// names the instance's evidence directory under --out.
	if !sandbox.ValidInstance(e.Instance) {
		return fmt.Errorf("instance: want 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	if e.Bundle == "" {
		return errors.New("no bundle")
	}
	if _, err := bundle.CheckRef(e.Bundle); err != nil {
		return fmt.Errorf("bundle %s: %v", e.Bundle, err)
	}
	n := 0
	for _, p := range []string{e.Patch, e.Workspace} {
		if p != "" {
			n++
			if _, err := os.Stat(p); err != nil {
				return err
			}
		}
	}
	if e.patchText != nil {
		n++
		if int64(len(*e.patchText)) > maxPatch {
			return fmt.Errorf("model_patch: larger than --workspace-max-bytes (%d)", maxPatch)
		}
	}
	if n != 1 {
		return errors.New("give exactly one of patch and workspace")
	}
	return nil
}

// runInstances evaluates the entries, at most concurrency at once, and
// returns their outcomes in the entries' order. Once ctx ends no other
// instance starts.
func runInstances(ctx context.Context, s *sandboxes, signer *receipt.Signer, o *runOptions, entries []setEntry, concurrency int, prog *setProgress) []setOutcome {
	out := make([]setOutcome, len(entries))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i, e := range entries {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			out[i] = setOutcome{Instance: e.Instance, Bundle: e.Bundle, ExitCode: exitInfraError, Error: "not run: " + ctx.Err().Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = runInstance(ctx, s, signer, o, e)
			prog.done(out[i])
		}()
	}
	wg.Wait()
	return out
}

// runInstance is one instance's `sandboxd run`: what it would print on
// stderr becomes the outcome's error.
func runInstance(ctx context.Context, s *sandboxes, signer *receipt.Signer, o *runOptions, e setEntry) setOutcome {
	start := time.Now()
	res := setOutcome{Instance: e.Instance, Bundle: e.Bundle}
	oi := *o
	oi.bundle, oi.patch, oi.workspace, oi.junit = e.Bundle, e.Patch, e.Workspace, ""
	if o.out != "" {
		oi.out = filepath.Join(o.out, e.Instance)
	}
	var errs bytes.Buffer
	r := &runInvocation{instance: e.Instance, o: &oi, stdout: io.Discard, stderr: &errs}
	if e.patchText != nil {
		dir, err := inlinePatchWorkspace(*e.patchText, filepath.Join(s.state, "tmp"))
		if err != nil {
			res.ExitCode, res.Error = exitInfraError, err.Error()
			return res
		}
		defer os.RemoveAll(dir)
		oi.workspace = dir
	}
	ev, code := r.evaluate(ctx, s, signer)
	if code < 0 {
		res.BundleDigest, res.WorkspaceDigest = ev.bundleDigest, ev.workspace
		res.Verdict, res.Assessment, res.assessment = ev.outcome.Assessment.Verdict, ev.outcome.AssessmentJSON, &ev.outcome.Assessment
		code = r.report(ev)
	}
	res.ExitCode, res.Error = code, strings.TrimSpace(errs.String())
	res.DurationMS = time.Since(start).Milliseconds()
	return res
}

// inlinePatchWorkspace makes a workspace holding only text, as patchName,
// in a new directory below tmp.
func inlinePatchWorkspace(text, tmp string) (string, error) {
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(tmp, "patch-")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, patchName), []byte(text), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// reportSet prints the outcomes (a table, or the summary as JSON), writes
// the JUnit file, and returns the worst instance's exit code.
func reportSet(stdout, stderr io.Writer, o *runOptions, outcomes []setOutcome) int {
	sum := setSummary{Schema: "sandboxd.run-set/v1", Counts: map[string]int{}, Instances: outcomes}
	worst := exitPassed
	junit := make([]junitreport.Instance, len(outcomes))
	for i, oc := range outcomes {
		sum.Counts[oc.status()]++
		worst = max(worst, oc.ExitCode)
		junit[i] = junitreport.Instance{Name: oc.Instance, Assessment: oc.assessment, Error: oc.Error}
	}
	if o.json {
		b, _ := json.MarshalIndent(sum, "", "  ")
		stdout.Write(append(b, '\n'))
	} else {
		printSet(stdout, sum)
	}
	if o.junit != "" {
		if err := junitreport.WriteSetFile(o.junit, junit); err != nil {
			fmt.Fprintln(stderr, "sandboxd run-set: --junit:", err)
			return exitInfraError
		}
	}
	return worst
}

// status is the instance's verdict as its exit code says it (a candidate
// whose export cannot be taken is inconclusive without an assessment), or
// "error" when it reached none or a job of it ended with the sandbox
// failing.
func (oc setOutcome) status() string {
	switch oc.ExitCode {
	case exitPassed:
		return string(supervisor.Passed)
	case exitVerdictFail:
		return string(supervisor.Failed)
	case exitInconclusive:
		return string(supervisor.Inconclusive)
	}
	return "error"
}

func printSet(w io.Writer, sum setSummary) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tVERDICT\tSECONDS\tREASON")
	for _, oc := range sum.Instances {
		reason, _, _ := strings.Cut(oc.Error, "\n")
		if reason == "" && oc.assessment != nil {
			reason = firstReason(*oc.assessment)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\n", oc.Instance, oc.status(), float64(oc.DurationMS)/1000, reason)
	}
	tw.Flush()
	fmt.Fprintf(w, "run-set: %d instances: %d passed, %d failed, %d inconclusive, %d error\n",
		len(sum.Instances), sum.Counts["passed"], sum.Counts["failed"], sum.Counts["inconclusive"], sum.Counts["error"])
}

// firstReason is why an assessment did not pass: its reasons, else its
// first check that did not pass and how many more did not.
func firstReason(a supervisor.Assessment) string {
	if a.Verdict == supervisor.Passed {
		return ""
	}
	if len(a.Reasons) > 0 {
		return strings.Join(a.Reasons, "; ")
	}
	var first string
	n := 0
	for _, c := range a.Checks {
		if c.Status != supervisor.Passed {
			if n == 0 {
				first = c.Name + ": " + c.Reason
			}
			n++
		}
	}
	if n > 1 {
		first += fmt.Sprintf(" (and %d more)", n-1)
	}
	return first
}

// setProgress prints a line on stderr as each instance ends.
type setProgress struct {
	mu    sync.Mutex
	w     io.Writer
	n     int
	ended int
}

func newSetProgress(stderr io.Writer, quiet bool, n int) *setProgress {
	if quiet {
		return nil
	}
	return &setProgress{w: stderr, n: n}
}

func (p *setProgress) done(oc setOutcome) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended++
	fmt.Fprintf(p.w, "run-set: [%d/%d] %s: %s (%.1f s)\n", p.ended, p.n, oc.Instance, oc.status(), float64(oc.DurationMS)/1000)
}
