package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
)

// cmdImageImport is `sandboxd image import FILE|-`: load one image from a
// `docker save` tarball or an OCI image-layout archive and print its ID.
func cmdImageImport(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: sandboxd image import FILE|-") }
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	in := stdin
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(stderr, "sandboxd image import:", err)
			return exitBadInput
		}
		defer f.Close()
		in = f
	}
	eng, err := broker.NewEngine()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd image import: engine:", err)
		return exitInfraError
	}
	defer eng.Close()
	id, err := image.Import(ctx, eng, in, "")
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd image import:", err)
		if errors.Is(err, image.ErrNotImageArchive) {
			return exitBadInput
		}
		return exitInfraError
	}
	fmt.Fprintln(stdout, id)
	return exitOK
}
