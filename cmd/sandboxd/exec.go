package main

import (
	"context"
	"io"
)

func cmdExec(ctx context.Context, args []string, stdout, stderr io.Writer) int { return exitInfraError }
