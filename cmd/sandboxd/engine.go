package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/containerdengine"
	"github.com/sandboxd/sandboxd/internal/selfcheck"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Engine names for --engine.
const (
	engineDocker     = "docker"
	engineContainerd = "containerd"
)

// engineOptions are the flags choosing the broker's engine.
type engineOptions struct {
	name       string
	address    string
	namespace  string
	imageTrees imageTreesFlag
}

// imageTreesFlag is --image-trees: auto, on or off (broker.Config.ImageTrees).
// envErr is a $SANDBOXD_IMAGE_TREES the flag does not override and that
// is none of them: reported when the sandboxes are opened.
type imageTreesFlag struct {
	value  string
	envErr error
}

func (f *imageTreesFlag) String() string {
	if f.value == broker.ImageTreesAuto {
		return "auto"
	}
	return f.value
}

func (f *imageTreesFlag) Set(v string) error {
	switch v {
	case "auto":
		f.value = broker.ImageTreesAuto
	case broker.ImageTreesOn, broker.ImageTreesOff:
		f.value = v
	default:
		return fmt.Errorf("want auto, %s or %s", broker.ImageTreesOn, broker.ImageTreesOff)
	}
	f.envErr = nil
	return nil
}

// addEngineFlags adds --engine (default $SANDBOXD_ENGINE, else docker),
// --containerd-address and --containerd-namespace.
func addEngineFlags(fs *flag.FlagSet) *engineOptions {
	o := &engineOptions{}
	def := os.Getenv("SANDBOXD_ENGINE")
	if def == "" {
		def = engineDocker
	}
	fs.StringVar(&o.name, "engine", def, "engine that runs sandboxes: docker or containerd (default $SANDBOXD_ENGINE, else docker)")
	fs.StringVar(&o.address, "containerd-address", os.Getenv("SANDBOXD_CONTAINERD_ADDRESS"), "containerd socket (default: /run/containerd/containerd.sock, else dockerd's own)")
	fs.StringVar(&o.namespace, "containerd-namespace", "sandboxd", "containerd namespace of sandboxd's containers (never moby)")
	if v := os.Getenv("SANDBOXD_IMAGE_TREES"); v != "" {
		if err := o.imageTrees.Set(v); err != nil {
			o.imageTrees.envErr = fmt.Errorf("$SANDBOXD_IMAGE_TREES %q: %w", v, err)
		}
	}
	fs.Var(&o.imageTrees, "image-trees", "where jobs read the directories an image marks as trees (its Go toolchain, say): auto (from read-only volumes filled from the image and checked against it, where Docker's storage driver is fuse-overlayfs), on (so on any Docker engine), off (from the image); default $SANDBOXD_IMAGE_TREES, else auto")
	return o
}

// open returns the broker's engine: Docker itself, or containerd with
// images imported from Docker by ID. With runsc allowed, containerd runs
// it as the runc shim's binary through the sandboxd-runsc wrapper that
// scripts/setup writes.
func (o *engineOptions) open(ctx context.Context, docker *client.Client, allowRunsc bool) (broker.Engine, io.Closer, error) {
	switch o.name {
	case engineDocker:
		return docker, io.NopCloser(nil), nil
	case engineContainerd:
		cfg := containerdengine.Default()
		cfg.Address, cfg.Namespace, cfg.Docker = o.address, o.namespace, docker
		if d := os.Getenv("SANDBOXD_CONTAINERD_STATE"); d != "" {
			cfg.StateDir = d
		}
		if allowRunsc {
			var err error
			if cfg.RunscPath, err = besideExecutable("SANDBOXD_RUNSC", "sandboxd-runsc", "scripts/setup"); err != nil {
				return nil, nil, err
			}
		}
		e, err := containerdengine.New(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return e, e, nil
	}
	return nil, nil, fmt.Errorf("--engine %q is not docker or containerd", o.name)
}

// runtimeFlag is --runtime, the one check of it for every command that
// takes it (run, exec, selfcheck, serve): runc, or runsc (gVisor). Any
// other value is refused while the flags are parsed, so it is a usage error
// (exitUsage, the flag package naming the value) before anything touches an
// engine.
type runtimeFlag string

// addRuntimeFlag adds --runtime (default runc) with a command's usage text.
func addRuntimeFlag(fs *flag.FlagSet, usage string) *runtimeFlag {
	r := runtimeFlag(sandbox.RuntimeRunc)
	fs.Var(&r, "runtime", usage)
	return &r
}

func (r *runtimeFlag) String() string { return string(*r) }

func (r *runtimeFlag) Set(v string) error {
	if v != sandbox.RuntimeRunc && v != sandbox.RuntimeRunsc {
		return fmt.Errorf("want %s or %s (gVisor)", sandbox.RuntimeRunc, sandbox.RuntimeRunsc)
	}
	*r = runtimeFlag(v)
	return nil
}

// runsc reports whether the runtime is gVisor's, which a broker must be
// allowed to run.
func (r runtimeFlag) runsc() bool { return r == sandbox.RuntimeRunsc }

// sandboxes is an engine and the broker on it, opened the one way every
// command that runs sandboxes (run, exec, selfcheck, serve) opens them:
// openSandboxes, or openOneShot for a command without a daemon.
type sandboxes struct {
	docker *client.Client // the Docker engine: images are built here (containerd imports them from it)
	engine broker.Engine  // what the broker runs sandboxes on: Docker itself, or containerd
	broker *broker.Broker
	blobs  *store.Store
	state  string // the state directory: blobs, checked volumes, selfcheck passes

	closeEngine io.Closer
	leave       func() // ends a one-shot command's share of the blob store
}

// openSandboxes opens the Docker client, the engine eo names on it (runsc
// allowed as cfg says), the blob store under state and a broker with cfg,
// whose helper, version and checked-volume cache it fills in. A shared
// store is a one-shot command's, which the one-shot processes running at
// once share (store.Share); the daemon holds its state's lock instead.
// Errors of the engine itself begin "engine: ".
func openSandboxes(ctx context.Context, eo *engineOptions, cfg broker.Config, state string, shared bool) (*sandboxes, error) {
	s := &sandboxes{state: state, closeEngine: io.NopCloser(nil), leave: func() {}}
	err := s.open(ctx, eo, cfg, shared)
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *sandboxes) open(ctx context.Context, eo *engineOptions, cfg broker.Config, shared bool) (err error) {
	if s.docker, err = broker.NewEngine(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if s.engine, s.closeEngine, err = eo.open(ctx, s.docker, cfg.AllowRunsc); err != nil {
		s.closeEngine = io.NopCloser(nil)
		return fmt.Errorf("engine: %w", err)
	}
	if cfg.ShimPath, err = shimPath(); err != nil {
		return err
	}
	if s.blobs, err = store.Open(filepath.Join(s.state, "blobs")); err != nil {
		return err
	}
	if shared {
		if s.leave, err = s.blobs.Share(); err != nil {
			s.leave = func() {}
			return err
		}
	}
	cfg.Version = version
	if eo.imageTrees.envErr != nil {
		return eo.imageTrees.envErr
	}
	cfg.ImageTrees = eo.imageTrees.value
	cfg.CacheDir = filepath.Join(s.state, "checked-volumes")
	cfg.DigestMemo = digestMemo(s.state)
	s.broker, err = broker.New(s.engine, s.blobs, cfg)
	return err
}

// openOneShot opens a one-shot command's sandboxes: its broker name
// (oneShotConfig) on the state directory's shared blob store, runsc
// allowed or not.
func openOneShot(ctx context.Context, eo *engineOptions, allowRunsc bool) (*sandboxes, error) {
	state, err := stateDir()
	if err != nil {
		return nil, err
	}
	cfg := oneShotConfig()
	cfg.AllowRunsc = allowRunsc
	return openSandboxes(ctx, eo, cfg, state, true)
}

// gated is the broker with every job behind this process's selfcheck gate.
func (s *sandboxes) gated() selfcheck.GatedBroker {
	return selfcheck.GatedBroker{Broker: s.broker, Gate: selfcheckGate(s.engine, s.broker, s.blobs, s.state), Engine: engineKey(s.engine)}
}

// Close stops the broker's pool, ends this process's share of the blob
// store if collectCaches has not, and closes the engines.
func (s *sandboxes) Close() {
	if s.broker != nil {
		s.broker.ClosePool()
	}
	s.leave()
	s.closeEngine.Close()
	if s.docker != nil {
		s.docker.Close()
	}
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
	fs.Int64Var(&p.VolumeBudget, "volume-budget", p.VolumeBudget, "bytes of read-only input and image tree volumes of this broker name (every one-shot state's) kept when the command ends; beyond it the least recently used, not used in the last 10 minutes, are removed")
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

// besideExecutable finds a companion binary: $env, or name next to this
// executable.
func besideExecutable(env, name, how string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is not next to %s (made by %s; or set %s)", name, exe, how, env)
	}
	return p, nil
}

// engineKey names the engine a selfcheck pass holds for: Docker's host, or
// containerd's socket and namespace.
func engineKey(e broker.Engine) string {
	switch e := e.(type) {
	case *client.Client:
		return e.DaemonHost()
	case *containerdengine.Engine:
		return "containerd://" + e.Address() + "?namespace=" + e.Namespace()
	}
	return fmt.Sprintf("%T", e)
}
