package main

import (
	"context"
	"fmt"
	"io"
)

// cmdKeygen is not built yet; its issue replaces this file.
func cmdKeygen(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd: keygen: not implemented in this build")
	return exitInfraError
}
