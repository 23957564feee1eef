package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Exit codes shared by every command; `sandboxd run` documents its verdict
// codes in run.go. A usage error has a code no verdict uses (EX_USAGE of
// sysexits.h), so a CI step can tell a typo from an inconclusive verdict.
const (
	exitOK         = 0
	exitFailed     = 1  // the command's subject did not hold (e.g. verify failed)
	exitBadInput   = 3  // an input was refused
	exitInfraError = 4  // the engine or the host failed
	exitUsage      = 64 // bad flags or arguments
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands is the explicit table of subcommands: one file per command.
func commands() map[string]command {
	return map[string]command{
		"image":     {"build evaluator images without a registry", cmdImage},
		"exec":      {"run one command in a sandbox through the broker", cmdExec},
		"run":       {"evaluate a candidate workspace against a bundle", cmdRun},
		"run-set":   {"evaluate a set of instances (bundles and candidates), a bounded number at once", cmdRunSet},
		"bundle":    {"pack, inspect and verify evaluator bundles", cmdBundle},
		"workspace": {"ingest a candidate workspace", cmdWorkspace},
		"keygen":    {"write an encrypted signing key pair", cmdKeygen},
		"verify":    {"verify signed receipts and results offline", cmdVerify},
		"selfcheck": {"prove the isolation properties on this engine", cmdSelfcheck},
		"version":   {"print the version, the commit and the helper's digest", cmdVersion},
		"serve":     {"run the daemon (journal, API, recovery, metrics)", cmdServe},
		"submit":    {"submit a sealed job to the daemon; print its receipt", cmdSubmit},
		"wait":      {"wait for a job on the daemon; print its result", cmdWait},
		"status":    {"show a job's state on the daemon", cmdStatus},
		"fleet":     {"show a fleet's hosts, queue and stream health", cmdFleet},
		"gc":        {"collect the daemon's caches now (blobs, input volumes)", cmdGC},
		"assess":    {"re-verify an evidence directory and recompute its assessment", cmdAssess},
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || isHelp(args[0]) {
		usage(stderr, cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" {
		return cmdVersion(ctx, args[1:], stdout, stderr)
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sandboxd: unknown command %q\n", args[0])
		usage(stderr, cmds)
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: sandboxd COMMAND [ARGS]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, cmds[n].summary)
	}
	io.WriteString(w, b.String())
}

// parseFlags parses a command's flags: -1 to go on, exitOK after --help,
// exitUsage for a flag the command does not know (the flag package has
// already said which).
func parseFlags(fs *flag.FlagSet, args []string) int {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return -1
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	}
	return exitUsage
}

// isHelp reports whether a command's first argument asks for its usage.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// exitForStatus is the exit code of a command that reports one job's end:
// the sandbox failing (error, uncertain) is told apart from the job failing.
func exitForStatus(st sandbox.Status) int {
	switch st {
	case sandbox.StatusSucceeded:
		return exitOK
	case sandbox.StatusError, sandbox.StatusUncertain:
		return exitInfraError
	}
	return exitFailed
}
