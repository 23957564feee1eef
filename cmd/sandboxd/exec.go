package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// cmdExec runs one command in a sandbox through the broker and prints the
// result: the smallest end-to-end use of the broker, without bundles.
func cmdExec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	img := fs.String("image", "", "local image ID (sha256:…), or an images/<name> directory to build first")
	id := fs.String("id", "", "job id (default: a random one)")
	workdir := fs.String("workdir", sandbox.WorkPath, "working directory of the command")
	wall := fs.Duration("wall", time.Minute, "wall-clock limit")
	memory := fs.Int64("memory", 256<<20, "memory limit in bytes")
	pids := fs.Int64("pids", 128, "pids limit")
	disk := fs.Int64("disk", 64<<20, "size of each scratch tmpfs in bytes")
	asJSON := fs.Bool("json", false, "print the result as one line of JSON (docs/schema/result.json)")
	var outputs, env multiFlag
	fs.Var(&outputs, "output", "output directory to collect (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE for the command (repeatable)")
	eo := addEngineFlags(fs)
	cache := addCacheFlags(fs)
	rt := fs.String("runtime", sandbox.RuntimeRunc, "runtime of the sandbox: runc or runsc (gVisor)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd exec --image ID|DIR [flags] -- COMMAND [ARG...]")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if *img == "" || fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	if err := cache.Validate(); err != nil {
		fmt.Fprintln(stderr, "sandboxd exec: --volume-budget:", err)
		return exitUsage
	}
	eng, err := broker.NewEngine()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec: engine:", err)
		return exitInfraError
	}
	defer eng.Close()
	beng, closeEng, err := eo.open(ctx, eng, *rt == sandbox.RuntimeRunsc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec: engine:", err)
		return exitInfraError
	}
	defer closeEng.Close()
	imageID := *img
	if st, err := os.Stat(*img); err == nil && st.IsDir() {
		b, err := image.Build(ctx, eng, *img, "", nil)
		if err != nil {
			fmt.Fprintln(stderr, "sandboxd exec:", err)
			return exitBadInput
		}
		imageID = b.ID
	}
	if *id == "" {
		var r [6]byte
		rand.Read(r[:])
		*id = "exec-" + hex.EncodeToString(r[:])
	}
	envMap := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fmt.Fprintf(stderr, "sandboxd exec: --env %q is not KEY=VALUE\n", kv)
			return exitUsage
		}
		envMap[k] = v
	}
	limits := sandbox.DefaultLimits()
	limits.WallTimeMS = wall.Milliseconds()
	limits.MemoryBytes = *memory
	limits.Pids = *pids
	limits.DiskBytes = *disk
	job := sandbox.Job{
		Schema: sandbox.JobSchema, ID: *id, Image: imageID,
		Argv: fs.Args(), Env: envMap, WorkDir: *workdir, Outputs: outputs,
		Limits: limits, Network: sandbox.NetworkNone, Runtime: *rt,
	}
	if err := job.Seal(); err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitBadInput
	}
	b, blobs, leave, err := newBrokerAllowing(beng, *rt == sandbox.RuntimeRunsc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitInfraError
	}
	defer collectCaches(ctx, b, leave, *cache, stderr, "sandboxd exec")
	state, err := stateDir()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitInfraError
	}
	// The job runs only once the isolation selfcheck passed on its image
	// and runtime (a cached pass, or a check now).
	res, err := gatedBroker(beng, b, blobs, state).Run(ctx, job)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrImageRefused) || errors.Is(err, sandbox.ErrConflict) {
			return exitBadInput
		}
		return exitInfraError
	}
	if *asJSON {
		printJSON(stdout, stderr, res)
	} else {
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Fprintln(stdout, string(out))
	}
	if res.Stdout.Digest != "" && res.Stdout.Bytes > 0 {
		if f, err := blobs.Open(res.Stdout.Digest); err == nil {
			fmt.Fprintln(stderr, "--- stdout (as captured) ---")
			io.Copy(stderr, f)
			f.Close()
		}
	}
	return exitForStatus(res.Status)
}

// newBrokerAllowing returns a one-shot command's broker, allowing runsc
// jobs or not, on the state directory's blob store, which the one-shot
// processes running at once share (no state lock: several may run side by
// side). leave ends this process's share of the store (see store.Share);
// collectCaches calls it.
func newBrokerAllowing(eng broker.Engine, allowRunsc bool) (b *broker.Broker, blobs *store.Store, leave func(), err error) {
	shim, err := shimPath()
	if err != nil {
		return nil, nil, nil, err
	}
	dir, err := stateDir()
	if err != nil {
		return nil, nil, nil, err
	}
	blobs, err = store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		return nil, nil, nil, err
	}
	if leave, err = blobs.Share(); err != nil {
		return nil, nil, nil, err
	}
	cfg := oneShotConfig()
	cfg.ShimPath = shim
	cfg.Version = version
	cfg.CacheDir = filepath.Join(dir, "checked-volumes")
	cfg.AllowRunsc = allowRunsc
	if b, err = broker.New(eng, blobs, cfg); err != nil {
		leave()
		return nil, nil, nil, err
	}
	return b, blobs, leave, nil
}

// oneShotConfig is a one-shot command's broker configuration: not the
// daemon's default name, since a daemon reaps the job containers of its
// own name that its journal does not know and would take a one-shot run's
// container for one; nor its volumes' names, since a one-shot collection
// removes the volumes of its name and a daemon would mount one (its pins
// unknown to the one-shot process). $SANDBOXD_BROKER_NAME names separate
// brokers on one engine (tests, several users) the same way.
func oneShotConfig() broker.Config {
	cfg := broker.Default()
	cfg.Name = "sandboxd-cli"
	if name := os.Getenv("SANDBOXD_BROKER_NAME"); name != "" {
		cfg.Name = name
	}
	cfg.VolumePrefix = cfg.Name
	return cfg
}

// addCacheFlags adds --volume-budget to a one-shot command.
func addCacheFlags(fs *flag.FlagSet) *broker.CachePolicy {
	p := broker.DefaultCachePolicy()
	fs.Int64Var(&p.VolumeBudget, "volume-budget", p.VolumeBudget, "bytes of read-only input volumes of this broker name (every one-shot state's) kept when the command ends; beyond it the least recently used, not used in the last 10 minutes, are removed")
	return &p
}

// collectCaches ends a one-shot command: this process stops sharing the
// state's blob store, then the caches are collected (broker.CollectCaches:
// the state's idle blobs, input volumes beyond the budget). It runs after
// the command's result is printed and its exit code chosen, which it never
// changes: a failure is only said on stderr.
func collectCaches(ctx context.Context, b *broker.Broker, leave func(), p broker.CachePolicy, stderr io.Writer, cmd string) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "%s: collect caches: panic: %v (the result stands)\n", cmd, r)
		}
	}()
	leave()
	if ctx.Err() != nil {
		return // cancelled: the next one-shot command collects
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := b.CollectCaches(ctx, p); err != nil {
		fmt.Fprintf(stderr, "%s: collect caches: %v (the result stands)\n", cmd, err)
	}
}
