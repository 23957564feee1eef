package containerdengine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"
)

// Sockets of containerd, in the order they are tried: a dedicated host's
// packaged service, then the one dockerd runs for itself.
var DefaultAddresses = []string{"/run/containerd/containerd.sock", "/var/run/docker/containerd/containerd.sock"}

// Config configures the engine. Only cmd/ fills it from flags.
type Config struct {
	// Address is containerd's socket; empty: the first of DefaultAddresses
	// that answers.
	Address string
	// Namespace is the containerd namespace of everything this engine
	// makes. It is never "moby" (dockerd's own).
	Namespace string
	// StateDir holds what the engine keeps on the host: volume
	// directories, the containers' stdio logs and stdin FIFOs, and the
	// create options each container's spec is checked against. It must
	// be private to root.
	StateDir string
	// RunscPath, if set, is the binary the runc shim runs for jobs that ask
	// for the runsc runtime (a wrapper passing --network=none: runsc
	// refuses to run with its network enabled in a namespace without
	// interfaces). Empty: runsc jobs are refused.
	RunscPath string
	// Snapshotter unpacks images; "overlayfs" by default.
	Snapshotter string
	// Docker, if set, is the Docker engine images are imported from (by
	// ID, never pulled) when they are not yet in the namespace.
	Docker *client.Client
}

// Default returns the configuration of a host with dockerd's containerd.
func Default() Config {
	return Config{Namespace: "sandboxd", StateDir: "/var/lib/sandboxd/containerd", Snapshotter: "overlayfs"}
}

var namespaceRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`) // at most 63 bytes (see volumeNameRE)

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case len(c.Namespace) > 63 || !namespaceRE.MatchString(c.Namespace):
		return fmt.Errorf("containerd engine: namespace %q is not [a-z0-9][a-z0-9_.-]{0,62}", c.Namespace)
	case c.Namespace == "moby":
		return errors.New("containerd engine: namespace moby is dockerd's; sandboxd never uses it")
	case !filepath.IsAbs(c.StateDir):
		return fmt.Errorf("containerd engine: state directory %q is not absolute", c.StateDir)
	case c.Snapshotter == "":
		return errors.New("containerd engine: Snapshotter is empty")
	case c.RunscPath != "" && !filepath.IsAbs(c.RunscPath):
		// The shim would look a bare name up in containerd's PATH, and a
		// relative one from its bundle: neither is the file named here.
		return fmt.Errorf("containerd engine: runsc's binary %q is not an absolute path", c.RunscPath)
	}
	return nil
}

// Engine is the broker's engine on containerd.
type Engine struct {
	cfg      Config
	c        *containerd.Client
	runtimes map[string]string // job runtime → the binary the runc shim runs ("" = runc)
	imports  *importer
	// creating are the names this process's creates have taken and not
	// yet recorded a container under (ContainerRemove leaves them);
	// naming orders a create's taking of a name after a removal's look
	// at it, and the reverse.
	naming   sync.Mutex
	creating map[string]bool
	// makingTasks are the task creates under way in this process, by
	// container ID: each runs to its end whatever becomes of its caller
	// (see newTask), and a removal of the container waits for it.
	// removingTasks count the removals under way of each container: no
	// task create of it begins while there is one.
	taskMu        sync.Mutex
	makingTasks   map[string]chan struct{}
	removingTasks map[string]int
}

// New connects to containerd. It makes the state directory; nothing else
// is touched until the broker calls.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "volumes"), filepath.Join(cfg.StateDir, "io")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("containerd engine: state directory: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("containerd engine: state directory: %w", err)
		}
	}
	addrs := DefaultAddresses
	if cfg.Address != "" {
		addrs = []string{cfg.Address}
	}
	var errs []error
	for _, a := range addrs {
		if _, err := os.Stat(a); err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := containerd.New(a, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = c.Version(pctx)
		cancel()
		if err != nil {
			c.Close()
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		cfg.Address = a
		e := &Engine{cfg: cfg, c: c, runtimes: map[string]string{"runc": "runc"}}
		if cfg.RunscPath != "" {
			e.runtimes["runsc"] = cfg.RunscPath
		}
		e.imports = newImporter(e)
		return e, nil
	}
	return nil, fmt.Errorf("containerd engine: no containerd answers: %w", errors.Join(errs...))
}

// Address is the socket the engine talks to.
func (e *Engine) Address() string { return e.cfg.Address }

// Namespace is the containerd namespace the engine works in.
func (e *Engine) Namespace() string { return e.cfg.Namespace }

// Close waits (up to 30 s) for the task creates this process began, so
// that none is cut short inside containerd, then disconnects.
func (e *Engine) Close() error {
	e.tasksInFlight(30 * time.Second)
	return e.c.Close()
}

func (e *Engine) ns(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, e.cfg.Namespace)
}

// Info reports what one container can be given on this host, where
// containerd runs (its socket is local): NCPU, the CPUs this process may
// run on, counted as dockerd counts its own (a job's CPU quota beyond
// them would bound nothing), and MemTotal, the host's memory.
func (e *Engine) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		return client.SystemInfoResult{}, fmt.Errorf("host CPUs: %w", err)
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return client.SystemInfoResult{}, fmt.Errorf("host memory: %w", err)
	}
	var r client.SystemInfoResult
	r.Info.NCPU = cpus.Count()
	r.Info.MemTotal = int64(si.Totalram) * int64(si.Unit)
	r.Info.OSType = "linux"
	return r, nil
}

// ServerVersion reports containerd's version; the engine is named in
// Platform so that results say which engine ran the job. Its Components
// are containerd (its revision: a rebuild keeps the version) and the
// binaries that run this engine's containers, by path and digest (parts).
func (e *Engine) ServerVersion(ctx context.Context, _ client.ServerVersionOptions) (client.ServerVersionResult, error) {
	v, err := e.c.Version(e.ns(ctx))
	if err != nil {
		return client.ServerVersionResult{}, err
	}
	res := client.ServerVersionResult{Version: "containerd " + v.Version, APIVersion: "containerd/" + v.Version, Os: "linux"}
	res.Platform.Name = "containerd"
	res.Components = append([]system.ComponentVersion{{Name: "containerd", Version: v.Version, Details: map[string]string{"GitCommit": v.Revision}}}, e.parts()...)
	return res, nil
}
