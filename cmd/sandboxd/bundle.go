package main

import (
	"context"
	"fmt"
	"io"
)

// cmdBundle is not built yet; its issue replaces this file.
func cmdBundle(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd: bundle: not implemented in this build")
	return exitInfraError
}
