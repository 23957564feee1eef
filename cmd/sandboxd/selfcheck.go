package main

import (
	"context"
	"fmt"
	"io"
)

// cmdSelfcheck is not built yet; its issue replaces this file.
func cmdSelfcheck(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd: selfcheck: not implemented in this build")
	return exitInfraError
}
