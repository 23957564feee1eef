package testharness

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/containerdengine"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Engine is what the suites call on the broker's engine: the broker's
// own calls and a resource update (to tamper with a pooled sandbox).
type Engine interface {
	broker.Engine
	ContainerUpdate(ctx context.Context, id string, options client.ContainerUpdateOptions) (client.ContainerUpdateResult, error)
}

// Env is the shared test environment.
type Env struct {
	// Eng is the broker's engine: Docker, or containerd when
	// SANDBOXD_ENGINE=containerd (images are built by Docker either way).
	Eng Engine
	// Docker is the Docker engine: images, and what only Docker has.
	Docker *client.Client
	// EngineName is "docker" or "containerd".
	EngineName string
	// Ctr is the containerd engine, nil on Docker.
	Ctr        *containerdengine.Engine
	Blobs      *store.Store
	Broker     *broker.Broker
	Cfg        broker.Config
	Minimal    string // image ID of images/minimal
	Shim       string // path of the built helper binary
	Probe      string // path of the built isolation probe
	Repo       string // repository root
	Tmp        string // removed at the end
	BrokerName string
	// Runtime is the runtime the suites' jobs ask for: runc, or runsc when
	// SANDBOXD_IT_RUNTIME=runsc (on containerd, through $SANDBOXD_RUNSC).
	Runtime string
}

// Main runs the tests of a package that needs the engine and returns the
// exit code: it sets up env, runs m, and fails if anything is left behind.
func Main(m *testing.M, env **Env) int {
	ctx := context.Background()
	e, err := setup(ctx)
	if errors.Is(err, ErrNoEngine) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		return 1
	}
	defer os.RemoveAll(e.Tmp)
	*env = e
	code := m.Run()
	if err := e.teardown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		code = 1
	}
	return code
}

// ErrNoEngine means no engine answers and CI is not set: engine tests are
// skipped. Under CI=true a missing engine is an error instead.
var ErrNoEngine = fmt.Errorf("no engine")

// Connect returns a client of the engine that answers, ErrNoEngine when
// none does outside CI, or an error under CI=true.
func Connect(ctx context.Context) (*client.Client, error) {
	eng, err := broker.NewEngine()
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = eng.Ping(pctx, client.PingOptions{})
		cancel()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			return nil, fmt.Errorf("no container engine answers, and CI=true: failing: %w", err)
		}
		fmt.Fprintln(os.Stderr, "no container engine; engine tests are skipped (set CI=true to make this a failure):", err)
		return nil, ErrNoEngine
	}
	return eng, nil
}

func setup(ctx context.Context) (*Env, error) {
	eng, err := Connect(ctx)
	if err != nil {
		return nil, err
	}
	e := &Env{Eng: eng, Docker: eng, EngineName: "docker"}
	_, file, _, _ := runtime.Caller(0)
	e.Repo = filepath.Dir(filepath.Dir(filepath.Dir(file)))
	if e.Tmp, err = os.MkdirTemp("", "sandboxd-it-"); err != nil {
		return nil, err
	}
	if err := e.connectContainerd(ctx); err != nil {
		return nil, err
	}
	if e.Runtime, err = itRuntime(e.Ctr != nil); err != nil {
		return nil, err
	}
	e.Shim = filepath.Join(e.Tmp, "sandboxd-shim")
	if err := GoBuild(e.Repo, "./cmd/sandboxd-shim", e.Shim); err != nil {
		return nil, err
	}
	e.Probe = filepath.Join(e.Tmp, "sandboxd-probe")
	if err := GoBuild(e.Repo, "./cmd/sandboxd-probe", e.Probe); err != nil {
		return nil, err
	}
	img, err := image.Build(ctx, e.Docker, filepath.Join(e.Repo, "images", "minimal"), e.Tmp, nil)
	if err != nil {
		return nil, fmt.Errorf("build minimal image: %w", err)
	}
	e.Minimal = img.ID
	if e.Blobs, err = store.Open(filepath.Join(e.Tmp, "blobs")); err != nil {
		return nil, err
	}
	e.BrokerName = "sandboxd-it-" + randHex(4)
	e.Cfg = broker.Default()
	e.Cfg.Name = e.BrokerName
	e.Cfg.VolumePrefix = e.BrokerName
	e.Cfg.ShimPath = e.Shim
	if e.Runtime == sandbox.RuntimeRunsc {
		e.Cfg.AllowRunsc = true
	}
	// SANDBOXD_IT_POOL=N runs the suite's jobs on a broker that keeps N
	// sandboxes ready per shape (scripts/test runs the hostile suite so):
	// every attack then also meets pooled sandboxes. Brokers a test makes
	// from Cfg stay without a pool.
	bcfg := e.Cfg
	if n, err := strconv.Atoi(os.Getenv("SANDBOXD_IT_POOL")); err == nil && n > 0 {
		bcfg.PoolSize, bcfg.PoolIdle = n, 10*time.Minute
	}
	if e.Broker, err = broker.New(e.Eng, e.Blobs, bcfg); err != nil {
		return nil, err
	}
	return e, nil
}

// GoBuild builds a static binary of pkg (relative to repo) at out.
func GoBuild(repo, pkg, out string) error {
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

func (e *Env) teardown(ctx context.Context) error {
	e.Broker.ClosePool()
	if os.Getenv("SANDBOXD_IT_POOL") != "" {
		used := e.Broker.Stats().PoolUsed.Load()
		fmt.Fprintf(os.Stderr, "harness: %d jobs ran in pooled sandboxes\n", used)
		if used == 0 {
			return errors.New("SANDBOXD_IT_POOL is set but no job ran in a pooled sandbox")
		}
	}
	// Only this run's resources: other suites may be running beside it.
	mine := broker.LabelBroker + "=" + e.BrokerName
	if left := e.Leftovers(ctx, mine, broker.LabelJob); len(left) > 0 {
		return fmt.Errorf("job containers of broker %s left behind: %v", e.BrokerName, left)
	}
	if err := broker.RemoveCache(ctx, e.Eng, e.BrokerName); err != nil {
		return fmt.Errorf("remove cache volumes: %w", err)
	}
	if left := e.Leftovers(ctx, mine); len(left) > 0 {
		return fmt.Errorf("resources of broker %s left behind: %v", e.BrokerName, left)
	}
	return nil
}

// Leftovers lists containers and volumes carrying every label filter.
func (e *Env) Leftovers(ctx context.Context, labels ...string) []string {
	var out []string
	f := make(client.Filters).Add("label", labels...)
	cs, err := e.Eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, c := range cs.Items {
		out = append(out, "container "+c.ID[:12]+" "+fmt.Sprint(c.Names))
	}
	vs, err := e.Eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return append(out, "list volumes: "+err.Error())
	}
	for _, v := range vs.Items {
		out = append(out, "volume "+v.Name)
	}
	sort.Strings(out)
	return out
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewJob returns a sealed job running argv in the minimal image with small
// limits; mod may change it before sealing.
func (e *Env) NewJob(t testing.TB, argv []string, mod func(*sandbox.Job)) sandbox.Job {
	t.Helper()
	l := sandbox.DefaultLimits()
	l.WallTimeMS = 20_000
	l.MemoryBytes = 128 << 20
	l.Pids = 64
	l.DiskBytes = 32 << 20
	l.OutputBytes = 8 << 20
	l.LogBytes = 64 << 10
	l.FileCount = 100
	j := sandbox.Job{
		Schema: sandbox.JobSchema, ID: "it-" + randHex(4), Image: e.Minimal,
		Argv: argv, Env: map[string]string{}, WorkDir: sandbox.WorkPath, Outputs: []string{"/work/out"},
		Limits: l, Network: sandbox.NetworkNone, Runtime: e.Runtime,
	}
	if mod != nil {
		mod(&j)
	}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

// Sh wraps a shell script as argv.
func Sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// Run runs a job on b (e.Broker if nil), fails the test if the broker
// refused it or its result does not validate, and checks nothing is left.
func (e *Env) Run(t testing.TB, b *broker.Broker, j sandbox.Job) sandbox.Result {
	t.Helper()
	if b == nil {
		b = e.Broker
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := b.Run(ctx, j)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := res.Validate(); err != nil {
		t.Fatalf("result does not validate: %v", err)
	}
	e.AssertGone(t, j)
	return res
}

// AssertGone checks that no container of the job remains.
func (e *Env) AssertGone(t testing.TB, j sandbox.Job) {
	t.Helper()
	cs, err := e.Eng.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", broker.LabelJob+"="+j.ID)})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Items) != 0 {
		t.Errorf("job %s left %d containers", j.ID, len(cs.Items))
	}
	// A pooled sandbox carries no job label but takes the job's name.
	for _, name := range []string{e.BrokerName, e.Cfg.Name} {
		if _, err := e.Eng.ContainerInspect(context.Background(), broker.ContainerName(name, j.ID, j.Digest), client.ContainerInspectOptions{}); err == nil {
			t.Errorf("job %s left its container %s", j.ID, broker.ContainerName(name, j.ID, j.Digest))
		}
	}
}

// Blob reads a blob from the store.
func (e *Env) Blob(t testing.TB, d string) []byte {
	t.Helper()
	f, err := e.Blobs.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	b.ReadFrom(f)
	return b.Bytes()
}

// Stdout and Stderr return a result's captured logs.
func (e *Env) Stdout(t testing.TB, r sandbox.Result) string {
	return string(e.Blob(t, r.Stdout.Digest))
}
func (e *Env) Stderr(t testing.TB, r sandbox.Result) string {
	return string(e.Blob(t, r.Stderr.Digest))
}

// PutTree stores files (path → content; a name ending in "/" is a
// directory, a name ending in "*" an executable file) as a canonical tar
// and returns its digest.
func (e *Env) PutTree(t testing.TB, files map[string]string) string {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(files[n])), Format: tar.FormatPAX}
		switch n[len(n)-1] {
		case '/':
			h = &tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir, Format: tar.FormatPAX}
		case '*':
			h.Name, h.Mode = n[:len(n)-1], 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[n]))
	}
	tw.Close()
	sum, err := bundle.IngestTar(context.Background(), e.Blobs, &buf, bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return sum.Digest
}

// connectContainerd switches the suites to the containerd engine when
// SANDBOXD_ENGINE=containerd (ConnectContainerd).
func (e *Env) connectContainerd(ctx context.Context) error {
	ctr, err := ConnectContainerd(ctx, e.Docker)
	if err != nil || ctr == nil {
		return err
	}
	e.Eng, e.Ctr, e.EngineName = ctr, ctr, "containerd"
	return nil
}

// ConnectContainerd returns the containerd engine when
// SANDBOXD_ENGINE=containerd, nil on Docker: its state lives in
// $SANDBOXD_CONTAINERD_STATE if set, and it imports images from docker by
// ID. When containerd does not answer it returns ErrNoEngine, or an error
// under CI=true.
func ConnectContainerd(ctx context.Context, docker *client.Client) (*containerdengine.Engine, error) {
	switch os.Getenv("SANDBOXD_ENGINE") {
	case "", "docker":
		return nil, nil
	case "containerd":
	default:
		return nil, fmt.Errorf("SANDBOXD_ENGINE=%q is not docker or containerd", os.Getenv("SANDBOXD_ENGINE"))
	}
	cfg := containerdengine.Default()
	cfg.Docker = docker
	cfg.Address = os.Getenv("SANDBOXD_CONTAINERD_ADDRESS")
	if d := os.Getenv("SANDBOXD_CONTAINERD_STATE"); d != "" {
		cfg.StateDir = d
	}
	cfg.RunscPath = os.Getenv("SANDBOXD_RUNSC")
	ctr, err := containerdengine.New(ctx, cfg)
	if err != nil {
		if os.Getenv("CI") == "true" {
			return nil, fmt.Errorf("SANDBOXD_ENGINE=containerd but containerd does not answer, and CI=true: failing: %w", err)
		}
		fmt.Fprintln(os.Stderr, "SANDBOXD_ENGINE=containerd but containerd does not answer; engine tests are skipped:", err)
		return nil, ErrNoEngine
	}
	fmt.Fprintf(os.Stderr, "harness: engine containerd at %s, namespace %s\n", ctr.Address(), ctr.Namespace())
	return ctr, nil
}

// itRuntime is the runtime SANDBOXD_IT_RUNTIME names ("" is runc). runsc
// is run on containerd only, where $SANDBOXD_RUNSC names its wrapper
// (scripts/setup writes bin/sandboxd-runsc): a suite asked to run on runsc
// fails rather than run on runc.
func itRuntime(containerd bool) (string, error) {
	switch rt := os.Getenv("SANDBOXD_IT_RUNTIME"); rt {
	case "", sandbox.RuntimeRunc:
		return sandbox.RuntimeRunc, nil
	case sandbox.RuntimeRunsc:
		if !containerd || os.Getenv("SANDBOXD_RUNSC") == "" {
			return "", errors.New("SANDBOXD_IT_RUNTIME=runsc needs SANDBOXD_ENGINE=containerd and SANDBOXD_RUNSC (the wrapper scripts/setup writes at bin/sandboxd-runsc)")
		}
		fmt.Fprintf(os.Stderr, "harness: jobs run on runsc (%s)\n", os.Getenv("SANDBOXD_RUNSC"))
		return rt, nil
	default:
		return "", fmt.Errorf("SANDBOXD_IT_RUNTIME=%q is not runc or runsc", rt)
	}
}

// Events follows the engine's container events from now on (Docker also
// replays the last second; containerd replays nothing).
func (e *Env) Events(ctx context.Context, opts client.EventsListOptions) client.EventsResult {
	if e.Ctr != nil {
		return e.Ctr.Events(ctx, opts)
	}
	return e.Docker.Events(ctx, opts)
}

// ContainerdWithRunsc returns a second containerd engine whose runsc
// runtime is the binary at path (tests of runsc's failures), closed when
// the test ends. It fails the test on Docker.
func (e *Env) ContainerdWithRunsc(t testing.TB, path string) *containerdengine.Engine {
	t.Helper()
	if e.Ctr == nil {
		t.Fatal("not on the containerd engine")
	}
	cfg := containerdengine.Default()
	cfg.Address, cfg.Namespace, cfg.Docker = e.Ctr.Address(), e.Ctr.Namespace(), e.Docker
	if d := os.Getenv("SANDBOXD_CONTAINERD_STATE"); d != "" {
		cfg.StateDir = d
	}
	cfg.RunscPath = path
	ctr, err := containerdengine.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close() })
	return ctr
}
