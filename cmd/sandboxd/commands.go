package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Exit codes shared by every command; `sandboxd run` documents its verdict
// codes in run.go.
const (
	exitOK         = 0
	exitFailed     = 1 // the command's subject did not hold (e.g. verify failed)
	exitUsage      = 2 // bad flags or arguments
	exitBadInput   = 3 // an input was refused
	exitInfraError = 4 // the engine or the host failed
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
		"bundle":    {"pack, inspect and verify evaluator bundles", cmdBundle},
		"workspace": {"ingest a candidate workspace", cmdWorkspace},
		"keygen":    {"write an encrypted signing key pair", cmdKeygen},
		"verify":    {"verify signed receipts and results offline", cmdVerify},
		"selfcheck": {"prove the isolation properties on this engine", cmdSelfcheck},
		"version":   {"print the version", cmdVersion},
		"serve":     {"run the daemon (journal, API, recovery, metrics)", cmdServe},
		"submit":    {"submit a sealed job to the daemon; print its receipt", cmdSubmit},
		"wait":      {"wait for a job on the daemon; print its result", cmdWait},
		"status":    {"show a job's state on the daemon", cmdStatus},
		"assess":    {"re-verify an evidence directory and recompute its assessment", cmdAssess},
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
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

// version is set at link time for releases.
var version = "0.1.0-dev"

func cmdVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintln(stdout, version)
	return exitOK
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
