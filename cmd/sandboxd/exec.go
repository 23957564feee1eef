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
	b, blobs, err := newBrokerAllowing(beng, *rt == sandbox.RuntimeRunsc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitInfraError
	}
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

func newBroker(eng broker.Engine) (*broker.Broker, *store.Store, error) {
	return newBrokerAllowing(eng, false)
}

// newBrokerAllowing is newBroker, allowing runsc jobs or not.
func newBrokerAllowing(eng broker.Engine, allowRunsc bool) (*broker.Broker, *store.Store, error) {
	shim, err := shimPath()
	if err != nil {
		return nil, nil, err
	}
	dir, err := stateDir()
	if err != nil {
		return nil, nil, err
	}
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		return nil, nil, err
	}
	cfg := broker.Default()
	cfg.ShimPath = shim
	cfg.Version = version
	cfg.CacheDir = filepath.Join(dir, "checked-volumes")
	cfg.AllowRunsc = allowRunsc
	// Not the daemon's default name: a daemon reaps the job containers of
	// its own name that its journal does not know, and would take a
	// one-shot run's container for one.
	cfg.Name = "sandboxd-cli"
	if name := os.Getenv("SANDBOXD_BROKER_NAME"); name != "" {
		// Separate brokers on one engine (tests, several users) keep
		// separate cache volumes.
		cfg.Name, cfg.VolumePrefix = name, name
	}
	b, err := broker.New(eng, blobs, cfg)
	return b, blobs, err
}
