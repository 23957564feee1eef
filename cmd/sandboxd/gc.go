package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"
)

// cmdGC asks the daemon to collect its caches now and prints its report:
// orphan blobs removed, then the least recently used blobs and input
// volumes beyond --blob-budget and --volume-budget (what a queued or
// running job needs always stays). The daemon also does this at start and
// every 10 minutes.
func cmdGC(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o clientOptions
	fs := flag.NewFlagSet("gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, false)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: sandboxd gc [--socket PATH]")
		return exitUsage
	}
	c, err := o.client()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd gc:", err)
		return exitBadInput
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rep, err := c.GC(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd gc:", err)
		return exitFor(err)
	}
	fmt.Fprintln(stdout, string(rep))
	return exitOK
}
