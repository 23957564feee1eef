package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/containerdengine"
	"github.com/sandboxd/sandboxd/sandbox"
)

// bench holds what the items share: the daemon, the engine client and
// the samples.
type bench struct {
	o       options
	d       *daemon // on Docker
	dc      *daemon // on containerd
	eng     *client.Client
	ceng    *containerdengine.Engine
	results map[string]any
	// fleet are the fleet item's daemons, fleetNames their broker names.
	fleet      []*daemon
	fleetNames []string
	// stops end processes the bench started besides daemons (nats-server).
	stops []func()
}

// ctrName is the broker name of this run's containerd side.
func (b *bench) ctrName() string { return b.o.name + "-ctr" }

// ctrEngine returns the containerd engine, connecting once; images come
// from Docker by ID.
func (b *bench) ctrEngine(ctx context.Context) (*containerdengine.Engine, error) {
	if b.ceng != nil {
		return b.ceng, nil
	}
	eng, err := b.engine()
	if err != nil {
		return nil, err
	}
	cfg := containerdengine.Default()
	cfg.Docker = eng
	if b.o.runtime == sandbox.RuntimeRunsc {
		cfg.RunscPath = filepath.Join(b.o.bin, "sandboxd-runsc")
	}
	if b.ceng, err = containerdengine.New(ctx, cfg); err != nil {
		return nil, err
	}
	return b.ceng, nil
}

// close stops the daemon and removes everything this run created.
func (b *bench) close() {
	for _, d := range append([]*daemon{b.d, b.dc}, b.fleet...) {
		if d != nil {
			d.stop()
		}
	}
	for _, stop := range b.stops {
		stop()
	}
	b.removeLeftovers()
	if b.eng != nil {
		b.eng.Close()
	}
}

func machine() string {
	var model string
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var mem string
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1] + " kB"
	}
	dv, _ := exec.Command("docker", "version", "-f", "{{.Server.Version}}").Output()
	return fmt.Sprintf("%d cpus (%s), mem %s, docker %s, %s, load %s", runtime.NumCPU(), model, mem, strings.TrimSpace(string(dv)), runtime.Version(), loadavg())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }

func msList(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / 1e6
	}
	return out
}

func randID(prefix string) string {
	var r [6]byte
	rand.Read(r[:])
	return prefix + hex.EncodeToString(r[:])
}

// timed runs fn and returns how long it took.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// sh runs a command and returns its combined output on failure.
func sh(ctx context.Context, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(out.String(), 5))
	}
	return nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// dockerRun is the baseline: what a shell script around docker would do.
func (b *bench) dockerRun(ctx context.Context) error {
	return sh(ctx, nil, "docker", "run", "--rm", "--network", "none", b.o.image, "/bin/true")
}

// execEnv keeps `sandboxd exec`'s blobs and cache volumes to this run.
func (b *bench) execEnv() []string {
	return []string{"SANDBOXD_BROKER_NAME=" + b.o.name, "SANDBOXD_STATE=" + filepath.Join(b.o.tmp, "exec-state")}
}

// sandboxdExec is one no-op job through `sandboxd exec`: cold, one process.
func (b *bench) sandboxdExec(ctx context.Context) error {
	return sh(ctx, b.execEnv(), filepath.Join(b.o.bin, "sandboxd"), "exec", "--image", b.o.image, "--", "/bin/true")
}

// sandboxdExecCtr is sandboxdExec on the containerd engine.
func (b *bench) sandboxdExecCtr(ctx context.Context) error {
	env := []string{"SANDBOXD_BROKER_NAME=" + b.ctrName(), "SANDBOXD_STATE=" + filepath.Join(b.o.tmp, "exec-ctr-state")}
	return sh(ctx, env, filepath.Join(b.o.bin, "sandboxd"), "exec", "--engine", "containerd", "--runtime", b.o.runtime, "--image", b.o.image, "--", "/bin/true")
}

// noopJob is a sealed no-op job on runtime rt with the limits `sandboxd
// exec` uses.
func (b *bench) noopJob(rt string) sandbox.Job {
	l := sandbox.DefaultLimits()
	l.WallTimeMS = 60_000
	l.MemoryBytes = 256 << 20
	l.Pids = 128
	l.DiskBytes = 64 << 20
	j := sandbox.Job{
		Schema: sandbox.JobSchema, ID: randID("bench-"), Image: b.o.image,
		Argv: []string{"/bin/true"}, Env: map[string]string{}, WorkDir: sandbox.WorkPath,
		Limits: l, Network: sandbox.NetworkNone, Runtime: rt,
	}
	if err := j.Seal(); err != nil {
		panic(err)
	}
	return j
}

// engine returns the engine client, connecting once.
func (b *bench) engine() (*client.Client, error) {
	if b.eng != nil {
		return b.eng, nil
	}
	eng, err := broker.NewEngine()
	if err != nil {
		return nil, err
	}
	b.eng = eng
	return eng, nil
}

// leftovers lists containers and volumes labelled with this run's broker
// name, removes them and reports what it found. Cache volumes are expected
// (RemoveCache removes them); job containers are not.
func (b *bench) removeLeftovers() {
	for _, name := range append([]string{b.o.name}, b.fleetNames...) {
		b.removeLeftoversOf(name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.removeCtrLeftovers(ctx)
}

// removeLeftoversOf removes what a daemon of broker name left on Docker.
func (b *bench) removeLeftoversOf(name string) {
	eng, err := b.engine()
	if err != nil {
		fmt.Println("cleanup: engine:", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := make(client.Filters).Add("label", broker.LabelBroker+"="+name)
	cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err == nil {
		for _, c := range cs.Items {
			fmt.Printf("cleanup: LEFT BEHIND: container %s (%v, role %s)\n", c.ID[:12], c.Names, c.Labels[broker.LabelRole])
			eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		}
	}
	if err := broker.RemoveCache(ctx, eng, name); err != nil {
		fmt.Println("cleanup: remove cache volumes:", err)
	}
	vs, err := eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err == nil && len(vs.Items) > 0 {
		for _, v := range vs.Items {
			fmt.Printf("cleanup: LEFT BEHIND: volume %s\n", v.Name)
		}
	}
	// The docker-cp peer's own resources carry the run's name too.
	fp := make(client.Filters).Add("label", "sandboxd.bench="+b.o.name)
	if cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: fp}); err == nil {
		for _, c := range cs.Items {
			eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		}
	}
	if vs, err := eng.VolumeList(ctx, client.VolumeListOptions{Filters: fp}); err == nil {
		for _, v := range vs.Items {
			eng.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
		}
	}
}

// removeCtrLeftovers is removeLeftovers for the containerd side.
func (b *bench) removeCtrLeftovers(ctx context.Context) {
	if b.ceng == nil {
		// A containerd daemon ran without the library engine (item 2
		// alone): its cache volumes are removed through an engine opened
		// now.
		if b.dc == nil && (b.o.fleetEngine != "containerd" || len(b.fleetNames) == 0) {
			return
		}
		if _, err := b.ctrEngine(ctx); err != nil {
			fmt.Println("cleanup: containerd:", err)
			return
		}
	}
	names := []string{b.ctrName()}
	if b.o.fleetEngine == "containerd" {
		names = append(names, b.fleetNames...)
	}
	for _, name := range names {
		f := make(client.Filters).Add("label", broker.LabelBroker+"="+name)
		if cs, err := b.ceng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil {
			for _, c := range cs.Items {
				fmt.Printf("cleanup: LEFT BEHIND on containerd: container %s (%v, role %s)\n", c.ID, c.Names, c.Labels[broker.LabelRole])
				b.ceng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
			}
		}
		if err := broker.RemoveCache(ctx, b.ceng, name); err != nil {
			fmt.Println("cleanup: remove containerd cache volumes:", err)
		}
	}
	b.ceng.Close()
}
