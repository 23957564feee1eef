package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/store"
)

const workspaceUsage = `usage: sandboxd workspace ingest DIR|TAR [--store DIR] [--expect DIGEST] [--max-bytes N] [--max-files N] [--quiet]

Applies the reader rules to a candidate workspace (a directory or a tar
file) and computes its digest, the SHA-256 of its canonical tar. With
--store the canonical tar is kept in that blob store; --expect is a claimed
digest to check. Prints the counts, then the digest last.
`

type workspaceIngestOptions struct {
	src      string
	store    string
	expect   string
	maxBytes int64
	maxFiles int64
	quiet    bool
}

// cmdWorkspace ingests candidate workspaces.
func cmdWorkspace(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) {
		io.WriteString(stderr, workspaceUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] != "ingest" {
		fmt.Fprintf(stderr, "sandboxd: workspace: unknown subcommand %q\n", args[0])
		io.WriteString(stderr, workspaceUsage)
		return exitUsage
	}
	lim := bundle.DefaultLimits()
	o := workspaceIngestOptions{maxBytes: lim.MaxBytes, maxFiles: lim.MaxFiles}
	fset := flag.NewFlagSet("workspace ingest", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.StringVar(&o.store, "store", "", "keep the canonical tar in the blob store at `DIR`")
	fset.StringVar(&o.expect, "expect", "", "the `DIGEST` the workspace is claimed to have")
	fset.Int64Var(&o.maxBytes, "max-bytes", o.maxBytes, "ceiling on file content bytes")
	fset.Int64Var(&o.maxFiles, "max-files", o.maxFiles, "ceiling on files and directories")
	fset.BoolVar(&o.quiet, "quiet", false, "print no progress on stderr")
	fset.Usage = func() { io.WriteString(stderr, workspaceUsage); fset.PrintDefaults() }
	pos, code := parseInterleaved(fset, args[1:])
	if code >= 0 {
		return code
	}
	if len(pos) != 1 {
		fset.Usage()
		return exitUsage
	}
	o.src = pos[0]
	lim.MaxBytes, lim.MaxFiles = o.maxBytes, o.maxFiles
	if err := lim.Validate(); err != nil {
		fmt.Fprintf(stderr, "sandboxd: workspace ingest: %v\n", err)
		return exitUsage
	}
	var st *store.Store // nil: a dry run that only computes the digest
	if o.store != "" {
		var err error
		if st, err = store.Open(o.store); err != nil {
			fmt.Fprintf(stderr, "sandboxd: workspace ingest: %v\n", err)
			return exitInfraError
		}
	}
	step := progress.Start(newReporter(stderr, o.quiet), "ingesting workspace "+o.src)
	sum, err := bundle.Ingest(ctx, st, o.src, bundle.Options{Limits: lim, Expect: o.expect, Progress: func(n int64) { step.Update("reading", n, -1) }})
	endStep(step, err)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: workspace ingest: %v\n", err)
		return exitForInput(err)
	}
	fmt.Fprintf(stdout, "files: %d\ndirs:  %d\nbytes: %d\ntar:   %d bytes\n", sum.Files, sum.Dirs, sum.Bytes, sum.Size)
	if st != nil {
		fmt.Fprintf(stdout, "store: %s\n", st.Dir())
	}
	fmt.Fprintln(stdout, sum.Digest)
	return exitOK
}
