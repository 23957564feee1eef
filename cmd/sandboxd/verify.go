package main

import (
	"context"
	"fmt"
	"io"
)

// cmdVerify is not built yet; its issue replaces this file.
func cmdVerify(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd: verify: not implemented in this build")
	return exitInfraError
}
