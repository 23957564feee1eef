package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
)

func cmdImage(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "import" {
		return cmdImageImport(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, "usage: sandboxd image build [-q] DIR | sandboxd image import FILE|-")
		if len(args) > 0 && isHelp(args[0]) {
			return exitOK
		}
		return exitUsage
	}
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quiet := fs.Bool("q", false, "print only the image ID (and no progress)")
	noProgress := fs.Bool("quiet", false, "print no progress on stderr")
	asJSON := fs.Bool("json", false, "print the image as one line of JSON (docs/schema/image-build.json)")
	if code := parseFlags(fs, args[1:]); code >= 0 {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: sandboxd image build [-q] [--quiet] [--json] DIR")
		return exitUsage
	}
	eng, err := broker.NewEngine()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd image build: engine:", err)
		return exitInfraError
	}
	defer eng.Close()
	b, err := image.Build(ctx, eng, fs.Arg(0), "", newReporter(stderr, *quiet || *noProgress))
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd image build:", err)
		return exitBadInput
	}
	if *asJSON {
		return printJSON(stdout, stderr, struct {
			Name   string `json:"name"`
			ID     string `json:"id"`
			Loaded bool   `json:"loaded"`
		}{b.Name, b.ID, b.Loaded})
	}
	if !*quiet {
		state := "already present"
		if b.Loaded {
			state = "loaded"
		}
		fmt.Fprintf(stdout, "%s %s\n", b.Name, state)
	}
	fmt.Fprintln(stdout, b.ID)
	return exitOK
}
