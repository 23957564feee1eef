// Command sandboxd-probe runs inside a sandbox and reports, as one JSON
// document on stdout, what a candidate could reach from there (see package
// probe). Run it only inside a container, never directly on a host.
//
//	sandboxd-probe [report] [-o FILE] [-connect HOST:PORT] [-resolve NAME] [-readonly DIR]...
//	sandboxd-probe syscall NAME...   try the named denied syscalls
//	sandboxd-probe socket NAME...    try the named sockets (AF_VSOCK, AF_PACKET/raw, …)
//	sandboxd-probe abi               try getpid through the i386 ABI (int $0x80), in a child
//	sandboxd-probe forkbomb          start /bin/sleep children until fork fails
//	sandboxd-probe fdbomb            open /dev/null until open fails
//	sandboxd-probe zombies N         leave N exited, unreaped children behind
//	sandboxd-probe files N DIR       create N empty files in DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
)

func main() {
	// Descriptors first, before the runtime or this program open any.
	fds := probe.OpenFDs()
	os.Exit(run(os.Args[1:], fds, os.Stdout, os.Stderr))
}

type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, ",") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

func run(args []string, fds map[string]string, stdout, stderr io.Writer) int {
	mode := "report"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		mode, args = args[0], args[1:]
	}
	var out any
	var file string
	switch mode {
	case "report":
		fs := flag.NewFlagSet("report", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var opts probe.Options
		fs.StringVar(&opts.Connect, "connect", "", "host:port of a TCP listener that must be unreachable")
		fs.StringVar(&opts.Resolve, "resolve", "", "a name whose resolution must fail")
		ro := (*stringsFlag)(&opts.ReadOnly)
		fs.Var(ro, "readonly", "a directory that must refuse new files (repeatable)")
		fs.StringVar(&file, "o", "", "write the report to this file instead of stdout")
		if err := fs.Parse(args); err != nil {
			return 2
		}
		out = probe.Gather(opts, fds)
	case "syscall":
		out = map[string]any{"syscalls": probe.RunSyscalls(args...)}
	case "socket":
		out = map[string]any{"sockets": probe.RunSockets(args...)}
	case "abi":
		out = probe.TryForeignABI("/proc/self/exe", probe.ABIChildArg)
	case probe.ABIChildArg:
		probe.ForeignABIChild(stdout)
		return 0
	case "forkbomb":
		out = forkBomb()
	case "fdbomb":
		out = fdBomb()
	case "zombies":
		var n int
		if len(args) != 1 {
			return usage(stderr)
		}
		fmt.Sscan(args[0], &n)
		out = zombies(n)
	case "files":
		var n int
		if len(args) != 2 {
			return usage(stderr)
		}
		fmt.Sscan(args[0], &n)
		out = files(n, args[1])
	default:
		return usage(stderr)
	}
	b, err := json.Marshal(out)
	if err == nil && file != "" {
		err = os.WriteFile(file, append(b, '\n'), 0o644)
	} else if err == nil {
		_, err = stdout.Write(append(b, '\n'))
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd-probe:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) int {
	fmt.Fprintln(w, "usage: sandboxd-probe [report|syscall|socket|abi|forkbomb|fdbomb|zombies N|files N DIR] [ARGS]")
	return 2
}
