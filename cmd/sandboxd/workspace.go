package main

import (
	"context"
	"fmt"
	"io"
)

// cmdWorkspace is not built yet; its issue replaces this file.
func cmdWorkspace(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd: workspace: not implemented in this build")
	return exitInfraError
}
