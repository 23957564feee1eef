// Command bench measures sandboxd against what users would use instead of
// it (a shell script around `docker run`, `docker cp`, `tar | openssl`), as
// described in BENCHMARKS.md. It interleaves the two sides of every
// comparison, prints medians and ratios, and removes every container and
// volume it created (everything carries its own broker name).
//
// Run it through bench/run, which builds what it needs first.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// options are the flags of the bench command.
type options struct {
	image   string // local image ID of images/minimal
	bin     string // directory with sandboxd and sandboxd-shim
	rounds  int    // rounds of the single-job comparison
	batches int    // rounds of the 50-job comparison
	stage   int    // rounds of the 100 MiB staging comparison
	only    string // comma-separated items to run (1..5), empty for all
	out     string // JSON file for the raw samples
	profile string // directory for CPU profiles
	runtime string // runtime of the containerd side: runc or runsc
	// fleetEngine is the engine of item 6's daemons: docker or containerd.
	fleetEngine string
	tmp         string
	name        string // broker name: labels and volume prefix of this run
}

func main() {
	var o options
	flag.StringVar(&o.image, "image", "", "image ID of images/minimal (sha256:…)")
	flag.StringVar(&o.bin, "bin", "bin", "directory holding sandboxd and sandboxd-shim")
	flag.IntVar(&o.rounds, "rounds", 9, "rounds of item 1 (one no-op job)")
	flag.IntVar(&o.batches, "batches", 3, "rounds of item 2 (50 jobs at concurrency 4)")
	flag.IntVar(&o.stage, "stage-rounds", 3, "rounds of item 3 (100 MiB workspace)")
	flag.StringVar(&o.only, "only", "", "comma-separated items to run, e.g. 1,3 (default all)")
	flag.StringVar(&o.out, "json", "", "write raw samples to this JSON file")
	flag.StringVar(&o.profile, "profile", "", "write CPU profiles of sandboxd's side here")
	flag.StringVar(&o.runtime, "runtime", sandbox.RuntimeRunc, "runtime of the containerd side: runc or runsc (Docker and the baselines stay runc)")
	flag.StringVar(&o.fleetEngine, "fleet-engine", "docker", "engine of item 6's fleet daemons: docker or containerd")
	flag.Parse()
	if o.image == "" || (o.runtime != sandbox.RuntimeRunc && o.runtime != sandbox.RuntimeRunsc) || (o.fleetEngine != "docker" && o.fleetEngine != "containerd") {
		fmt.Fprintln(os.Stderr, "usage: bench -image sha256:… [-bin DIR] [-runtime runc|runsc] [-fleet-engine docker|containerd] (see bench/run)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, o))
}

func run(ctx context.Context, o options) int {
	var err error
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var r [4]byte
	rand.Read(r[:])
	o.name = "sbbench-" + hex.EncodeToString(r[:])
	if o.tmp, err = os.MkdirTemp("", o.name+"-"); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(o.tmp)
	b := &bench{o: o, results: map[string]any{}}
	defer b.close()

	fmt.Printf("sandboxd bench %s: %s\n", o.name, machine())
	fmt.Printf("runtime: containerd side %s; Docker side and baselines runc\n\n", o.runtime)
	b.results["containerd_runtime"] = o.runtime
	want := func(item string) bool {
		return o.only == "" || strings.Contains(","+o.only+",", ","+item+",")
	}
	steps := []struct {
		item string
		fn   func(context.Context) error
	}{
		{"1", b.noop},
		{"2", b.throughput},
		{"3", b.staging},
		{"4", b.memory},
		{"5", b.envelopes},
		{"6", b.fleetItem},
	}
	failed := false
	for _, s := range steps {
		if !want(s.item) {
			continue
		}
		start := time.Now()
		if err := s.fn(ctx); err != nil {
			fmt.Printf("item %s: FAILED: %v\n", s.item, err)
			failed = true
		}
		fmt.Printf("  (item %s took %s, load %s)\n\n", s.item, time.Since(start).Round(time.Second), loadavg())
		if ctx.Err() != nil {
			break
		}
	}
	if o.out != "" {
		out, _ := json.MarshalIndent(b.results, "", "  ")
		os.WriteFile(o.out, out, 0o644)
	}
	if failed {
		return 1
	}
	return 0
}
