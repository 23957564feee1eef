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

// execOptions are the flags of `sandboxd exec`.
type execOptions struct {
	image, id, workdir string
	wall               time.Duration
	memory, pids, disk int64
	json               bool
	outputs, env       multiFlag
	engine             *engineOptions
	cache              *broker.CachePolicy
	runtime            *runtimeFlag
}

// cmdExec runs one command in a sandbox through the broker and prints the
// result: the smallest end-to-end use of the broker, without bundles.
func cmdExec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, fs := execFlags(stderr)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if o.image == "" || fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	if err := o.cache.Validate(); err != nil {
		fmt.Fprintln(stderr, "sandboxd exec: --volume-budget:", err)
		return exitUsage
	}
	env, err := o.envMap()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitUsage
	}
	s, err := openOneShot(ctx, o.engine, o.runtime.runsc())
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitInfraError
	}
	defer s.Close()
	job, err := o.job(ctx, s.docker, fs.Args(), env)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		return exitBadInput
	}
	defer collectCaches(ctx, s.broker, s.leave, *o.cache, stderr, "sandboxd exec")
	// The job runs only once the isolation selfcheck passed on its image
	// and runtime (a cached pass, or a check now).
	res, err := s.gated().Run(ctx, job)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd exec:", err)
		if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, sandbox.ErrImageRefused) || errors.Is(err, sandbox.ErrConflict) {
			return exitBadInput
		}
		return exitInfraError
	}
	printExecResult(stdout, stderr, s.blobs, res, o.json)
	return exitForStatus(res.Status)
}

// execFlags declares the flags of `sandboxd exec`.
func execFlags(stderr io.Writer) (*execOptions, *flag.FlagSet) {
	o := &execOptions{}
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.image, "image", "", "local image ID (sha256:…), or an images/<name> directory to build first")
	fs.StringVar(&o.id, "id", "", "job id (default: a random one)")
	fs.StringVar(&o.workdir, "workdir", sandbox.WorkPath, "working directory of the command")
	fs.DurationVar(&o.wall, "wall", time.Minute, "wall-clock limit")
	fs.Int64Var(&o.memory, "memory", 256<<20, "memory limit in bytes")
	fs.Int64Var(&o.pids, "pids", 128, "pids limit")
	fs.Int64Var(&o.disk, "disk", 64<<20, "size of each scratch tmpfs in bytes")
	fs.BoolVar(&o.json, "json", false, "print the result as one line of JSON (docs/schema/result.json)")
	fs.Var(&o.outputs, "output", "output directory to collect (repeatable)")
	fs.Var(&o.env, "env", "KEY=VALUE for the command (repeatable)")
	o.engine = addEngineFlags(fs)
	o.cache = addCacheFlags(fs)
	o.runtime = addRuntimeFlag(fs, "runtime of the sandbox: runc or runsc (gVisor)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd exec --image ID|DIR [flags] -- COMMAND [ARG...]")
		fs.PrintDefaults()
	}
	return o, fs
}

// envMap is the command's environment from the --env flags.
func (o *execOptions) envMap() (map[string]string, error) {
	env := map[string]string{}
	for _, kv := range o.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--env %q is not KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}

// job is the sealed job the flags describe, its image built first when
// --image names a directory.
func (o *execOptions) job(ctx context.Context, docker image.Engine, argv []string, env map[string]string) (sandbox.Job, error) {
	imageID := o.image
	if st, err := os.Stat(o.image); err == nil && st.IsDir() {
		b, err := image.Build(ctx, docker, o.image, "", nil)
		if err != nil {
			return sandbox.Job{}, err
		}
		imageID = b.ID
	}
	id := o.id
	if id == "" {
		var r [6]byte
		rand.Read(r[:])
		id = "exec-" + hex.EncodeToString(r[:])
	}
	limits := sandbox.DefaultLimits()
	limits.WallTimeMS = o.wall.Milliseconds()
	limits.MemoryBytes = o.memory
	limits.Pids = o.pids
	limits.DiskBytes = o.disk
	job := sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: imageID,
		Argv: argv, Env: env, WorkDir: o.workdir, Outputs: o.outputs,
		Limits: limits, Network: sandbox.NetworkNone, Runtime: string(*o.runtime),
	}
	if err := job.Seal(); err != nil {
		return sandbox.Job{}, err
	}
	return job, nil
}

// printExecResult prints the result on stdout (indented, or one line of
// JSON) and the command's captured stdout on stderr.
func printExecResult(stdout, stderr io.Writer, blobs *store.Store, res sandbox.Result, asJSON bool) {
	if asJSON {
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
}
