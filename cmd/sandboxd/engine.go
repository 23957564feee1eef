package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/containerdengine"
)

// Engine names for --engine.
const (
	engineDocker     = "docker"
	engineContainerd = "containerd"
)

// engineOptions are the flags choosing the broker's engine.
type engineOptions struct {
	name      string
	address   string
	namespace string
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
		hook, err := besideExecutable("SANDBOXD_HOOK", "sandboxd-hook", "./cmd/sandboxd-hook")
		if err != nil {
			return nil, nil, err
		}
		cfg.HookPath = hook
		if allowRunsc {
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
