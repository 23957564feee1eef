package main

import (
	"context"
	"io"
)

func cmdImage(ctx context.Context, args []string, stdout, stderr io.Writer) int { return exitInfraError }
