package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
)

// cmdImageImport is `sandboxd image import FILE|-`: load one image from a
// `docker save` tarball or an OCI image-layout archive and print its ID.
func cmdImageImport(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: sandboxd image import FILE|-")
		return exitUsage
	}
	in := stdin
	if args[0] != "-" {
		f, err := os.Open(args[0])
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
