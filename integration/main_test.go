package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// env is shared by every test in the package.
var env struct {
	eng        *client.Client
	blobs      *store.Store
	broker     *broker.Broker
	cfg        broker.Config
	minimal    string // image ID
	shim       string // path of the built helper
	repo       string
	brokerName string
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx := context.Background()
	eng, err := broker.NewEngine()
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = eng.Ping(pctx, client.PingOptions{})
		cancel()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "integration: no container engine answers, and CI=true: failing:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "integration: no container engine; skipping (set CI=true to make this a failure):", err)
		return 0
	}
	env.eng = eng
	_, file, _, _ := runtime.Caller(0)
	env.repo = filepath.Dir(filepath.Dir(file))
	tmp, err := os.MkdirTemp("", "sandboxd-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)

	env.shim = filepath.Join(tmp, "sandboxd-shim")
	build := exec.Command("go", "build", "-o", env.shim, "./cmd/sandboxd-shim")
	build.Dir = env.repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: build helper: %v\n%s", err, out)
		return 1
	}
	img, err := image.Build(ctx, eng, filepath.Join(env.repo, "images", "minimal"), tmp, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: build minimal image:", err)
		return 1
	}
	env.minimal = img.ID
	env.blobs, err = store.Open(filepath.Join(tmp, "blobs"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var r [4]byte
	rand.Read(r[:])
	env.brokerName = "sandboxd-it-" + hex.EncodeToString(r[:])
	env.cfg = broker.Default()
	env.cfg.Name = env.brokerName
	env.cfg.VolumePrefix = env.brokerName
	env.cfg.ShimPath = env.shim
	env.broker, err = broker.New(eng, env.blobs, env.cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	code := m.Run()

	// Nothing a job created may remain; then drop this run's cache volumes.
	if left := leftovers(ctx, broker.LabelJob); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "integration: resources with label %s left behind: %v\n", broker.LabelJob, left)
		code = 1
	}
	if err := broker.RemoveCache(ctx, eng, env.brokerName); err != nil {
		fmt.Fprintln(os.Stderr, "integration: remove cache volumes:", err)
		code = 1
	}
	if left := leftovers(ctx, broker.LabelBroker+"="+env.brokerName); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "integration: resources of broker %s left behind: %v\n", env.brokerName, left)
		code = 1
	}
	return code
}

// leftovers lists containers and volumes carrying a label filter.
func leftovers(ctx context.Context, label string) []string {
	var out []string
	cs, err := env.eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", label)})
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, c := range cs.Items {
		out = append(out, "container "+c.ID[:12]+" "+fmt.Sprint(c.Names))
	}
	vs, err := env.eng.VolumeList(ctx, client.VolumeListOptions{Filters: make(client.Filters).Add("label", label)})
	if err != nil {
		return append(out, "list volumes: "+err.Error())
	}
	for _, v := range vs.Items {
		out = append(out, "volume "+v.Name)
	}
	sort.Strings(out)
	return out
}

// newJob returns a sealed job running argv in the minimal image.
func newJob(t *testing.T, argv []string, mod func(*sandbox.Job)) sandbox.Job {
	t.Helper()
	var r [4]byte
	rand.Read(r[:])
	l := sandbox.DefaultLimits()
	l.WallTimeMS = 20_000
	l.MemoryBytes = 128 << 20
	l.Pids = 64
	l.DiskBytes = 32 << 20
	l.OutputBytes = 8 << 20
	l.LogBytes = 64 << 10
	l.FileCount = 100
	j := sandbox.Job{
		Schema: sandbox.JobSchema, ID: "it-" + hex.EncodeToString(r[:]), Image: env.minimal,
		Argv: argv, Env: map[string]string{}, WorkDir: sandbox.WorkPath, Outputs: []string{"/work/out"},
		Limits: l, Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
	}
	if mod != nil {
		mod(&j)
	}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// runJob runs a job and fails the test if the broker refused it.
func runJob(t *testing.T, j sandbox.Job) sandbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := env.broker.Run(ctx, j)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := res.Validate(); err != nil {
		t.Fatalf("result does not validate: %v", err)
	}
	assertGone(t, j)
	return res
}

// assertGone checks that nothing of the job is left in the engine.
func assertGone(t *testing.T, j sandbox.Job) {
	t.Helper()
	cs, err := env.eng.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", broker.LabelJob+"="+j.ID)})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Items) != 0 {
		t.Errorf("job %s left %d containers", j.ID, len(cs.Items))
	}
}

func readBlob(t *testing.T, d string) []byte {
	t.Helper()
	f, err := env.blobs.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	b.ReadFrom(f)
	return b.Bytes()
}

func stdout(t *testing.T, r sandbox.Result) string { return string(readBlob(t, r.Stdout.Digest)) }
func stderr(t *testing.T, r sandbox.Result) string { return string(readBlob(t, r.Stderr.Digest)) }

// putTree stores a tar of files (path → content; a trailing "/" makes a
// directory) and returns its digest.
func putTree(t *testing.T, files map[string]string) string {
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
		if n[len(n)-1] == '/' {
			h = &tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir, Format: tar.FormatPAX}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[n]))
	}
	tw.Close()
	d, err := env.blobs.PutBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return d
}
