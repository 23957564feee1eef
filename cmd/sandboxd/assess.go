package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evidence"
	"github.com/sandboxd/sandboxd/internal/supervisor"
)

// assessOptions are the flags of `sandboxd assess`.
type assessOptions struct {
	keys   verifyKeyFlags // pinned broker public keys
	bundle string         // the trusted bundle: the policy comes from it, never from the evidence
	junit  string         // where to write the recomputed assessment as JUnit XML
	json   bool           // print the outcome as JSON (docs/schema/assess.json)
}

// Exit codes of `sandboxd assess`: exitOK (0) when every envelope verifies
// and is bound, every artifact used re-hashes, and the supervisor's
// recomputed assessments are byte-identical to the evidence's; exitFailed
// (1) when anything of that does not hold (the evidence is tampered,
// incomplete, about another bundle, or judged differently); exitUsage (64);
// exitBadInput (3) when the key, the bundle or the directory cannot be used
// at all (unreadable, not a key, a bundle that does not verify, no
// index.json).

// cmdAssess re-judges an evidence directory written by `sandboxd run
// --out`: it trusts only the pinned key and the bundle given, and prints the
// recomputed assessment JSON.
func cmdAssess(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, fset := assessFlags(stderr)
	if code := parseFlags(fset, args); code >= 0 {
		return code
	}
	if len(o.keys) == 0 || o.bundle == "" || fset.NArg() != 1 {
		fset.Usage()
		return exitUsage
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sandboxd assess: "+format+"\n", a...)
		return exitBadInput
	}
	keys, err := readKeySet(o.keys)
	if err != nil {
		return bad("--key: %v", err)
	}
	dir := fset.Arg(0)
	ev, err := evidence.Open(dir)
	if err != nil {
		return bad("%v", err)
	}
	defer ev.Close()
	tmp, err := os.MkdirTemp("", "sandboxd-assess-")
	if err != nil {
		return bad("%v", err)
	}
	defer os.RemoveAll(tmp)
	bun, cleanup, err := bundle.OpenRef(ctx, o.bundle, tmp)
	defer cleanup()
	if err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}
	if err := bun.Verify(ctx); err != nil {
		return bad("bundle %s does not verify: %v", o.bundle, err)
	}
	rep, err := ev.Check(ctx, keys, bun)
	if err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}
	if o.json {
		printAssessJSON(stdout, stderr, dir, rep)
	}
	return o.report(stdout, stderr, dir, ev, rep)
}

// assessFlags declares the flags of `sandboxd assess`.
func assessFlags(stderr io.Writer) (*assessOptions, *flag.FlagSet) {
	o := &assessOptions{}
	fset := flag.NewFlagSet("assess", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Var(&o.keys, "key", "pinned broker public key `PEM` file (repeat for key rotation)")
	fset.StringVar(&o.bundle, "bundle", "", "the evaluator bundle `REF` (directory with bundle.json or OCI layout) whose policy judges the evidence")
	fset.BoolVar(&o.json, "json", false, "print whether the evidence holds, its problems and the recomputed assessment as one line of JSON (docs/schema/assess.json)")
	fset.StringVar(&o.junit, "junit", "", "when the evidence holds, also write the recomputed assessment as JUnit XML to `FILE`")
	fset.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd assess --key PUB [--key PUB2] --bundle DIR|LAYOUT [--junit FILE] [--json] EVIDENCE_DIR")
		fset.PrintDefaults()
		fmt.Fprintln(stderr, "exit: 0 the evidence verifies and its assessment is reproduced byte for byte, 1 it does not, 3 bad input")
	}
	return o, fset
}

// printAssessJSON prints the check's report as one line of JSON
// (docs/schema/assess.json).
func printAssessJSON(stdout, stderr io.Writer, dir string, rep *evidence.Report) {
	var a json.RawMessage // null when nothing was recomputed
	if rep.Assessment != nil {
		a = rep.Assessment
	}
	printJSON(stdout, stderr, struct {
		Evidence   string             `json:"evidence"`
		Verified   bool               `json:"verified"`
		Recomputed bool               `json:"recomputed"`
		Envelopes  int                `json:"envelopes"`
		Verdict    supervisor.Verdict `json:"verdict"`
		Problems   []string           `json:"problems"`
		Notes      []string           `json:"notes"`
		Assessment json.RawMessage    `json:"assessment"`
	}{dir, rep.Recomputed && len(rep.Problems) == 0, rep.Recomputed, rep.Envelopes, rep.Verdict,
		append([]string{}, rep.Problems...), append([]string{}, rep.Notes...), a})
}

// report says what the check found, prints the recomputed assessment
// (without --json), writes --junit when the evidence holds, and returns
// the exit code.
func (o *assessOptions) report(stdout, stderr io.Writer, dir string, ev *evidence.Dir, rep *evidence.Report) int {
	if !rep.Recomputed {
		for _, p := range rep.Problems {
			fmt.Fprintf(stderr, "sandboxd assess: %s\n", p)
		}
		fmt.Fprintf(stderr, "sandboxd assess: %s: the evidence does not verify (%d problems); nothing was recomputed\n", dir, len(rep.Problems))
		return exitFailed
	}
	if rep.Assessment != nil && !o.json {
		stdout.Write(rep.Assessment)
		fmt.Fprintln(stdout)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(stderr, "sandboxd assess: note: %s\n", n)
	}
	if len(rep.Problems) > 0 {
		for _, p := range rep.Problems {
			fmt.Fprintf(stderr, "sandboxd assess: %s\n", p)
		}
		fmt.Fprintf(stderr, "sandboxd assess: %s: the recomputed assessment is not the evidence's (%d problems)\n", dir, len(rep.Problems))
		return exitFailed
	}
	if o.junit != "" {
		// Only an assessment the evidence reproduced is rendered.
		if err := writeJUnit(o.junit, rep.Assessment); err != nil {
			fmt.Fprintln(stderr, "sandboxd assess: --junit:", err)
			return exitInfraError
		}
	}
	fmt.Fprintf(stderr, "sandboxd assess: %s: %d envelopes verified; %s reproduced byte for byte (verdict %s)\n",
		dir, rep.Envelopes, ev.Index.Assessment, rep.Verdict)
	return exitOK
}
