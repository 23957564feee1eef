package integration

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// oneShotState is one one-shot process on a state directory, as
// `sandboxd run` and `exec` make it: the state's shared blob store, its
// check records, and the broker name every one-shot process shares.
type oneShotState struct {
	b     *broker.Broker
	blobs *store.Store
	leave func()
}

func newOneShot(t *testing.T, eng broker.Engine, name string) *oneShotState {
	t.Helper()
	state := t.TempDir()
	blobs, err := store.Open(filepath.Join(state, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	leave, err := blobs.Share()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leave)
	cfg := env.Cfg
	cfg.Name, cfg.VolumePrefix = name, name
	cfg.CacheDir = filepath.Join(state, "checked-volumes")
	b, err := broker.New(eng, blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &oneShotState{b: b, blobs: blobs, leave: leave}
}

// oneShotName is a broker name of this test's own, its cache removed at
// the end (with any input volume the engine made unlabelled for it).
func oneShotName(t *testing.T) string {
	t.Helper()
	name := env.BrokerName + "-o" + strings.ToLower(randSuffix(t))
	t.Cleanup(func() {
		ctx := context.Background()
		vs, _ := env.Eng.VolumeList(ctx, client.VolumeListOptions{})
		for _, v := range vs.Items {
			if strings.HasPrefix(v.Name, name+"-input-") && v.Labels[broker.LabelBroker] == "" {
				env.Eng.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{})
			}
		}
		if err := broker.RemoveCache(ctx, env.Eng, name); err != nil {
			t.Errorf("remove cache: %v", err)
		}
	})
	return name
}

// input stores a tree of one file in the state's blob store.
func (o *oneShotState) input(t *testing.T, file, content string) string {
	t.Helper()
	var buf bytes.Buffer
	_, err := sandbox.WriteTree(&buf, []sandbox.TreeEntry{{Name: file, Size: int64(len(content)), Open: func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(content)), nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := o.blobs.PutBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// stdout is a result's stdout from the state's blob store ("" if it is
// not there).
func (o *oneShotState) stdout(r sandbox.Result) string {
	f, err := o.blobs.Open(r.Stdout.Digest)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return string(b)
}

// cat runs a job that prints file from its read-only input and checks it.
func (o *oneShotState) cat(t *testing.T, digest, file, want string) {
	t.Helper()
	j := newJob(t, sh("cat /bundle/"+file), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: digest, Path: sandbox.BundlePath}}
	})
	r := env.Run(t, o.b, j)
	if got := o.stdout(r); r.Status != sandbox.StatusSucceeded || got != want {
		t.Fatalf("cat %s: %s (%s) %q, want succeeded %q", file, r.Status, r.Cause, got, want)
	}
}

func (o *oneShotState) volumes(t *testing.T) []string {
	t.Helper()
	vols, err := o.b.InputVolumes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		out = append(out, v.Digest)
	}
	slices.Sort(out)
	return out
}

// After a one-shot run, its collection (what `sandboxd run` and `exec`
// do last) removes the old input volumes of its broker name beyond the
// budget and its state's idle blobs; the fresh ones stay, and an evicted
// input is staged again when a job needs it. The floor is seconds here
// instead of the commands' 10 minutes: 10 of them, since the fresh input's
// job (a cold container: 3 s and more on a loaded two-core CI machine)
// must end well within the floor for its blob to count as used.
func TestOneShotRunCollectsOldInputs(t *testing.T) {
	t.Parallel()
	o := newOneShot(t, env.Eng, oneShotName(t))
	old1, old2 := o.input(t, "old1", "old one"), o.input(t, "old2", "old two")
	o.cat(t, old1, "old1", "old one")
	o.cat(t, old2, "old2", "old two")
	if got := o.volumes(t); len(got) != 2 {
		t.Fatalf("got volumes %v, want the two old ones", got)
	}
	const floor = 10 * time.Second
	time.Sleep(floor + time.Second) // engine times are in seconds
	fresh := o.input(t, "fresh", "fresh one")
	o.cat(t, fresh, "fresh", "fresh one")
	vols, _ := o.b.InputVolumes(context.Background())
	var budget int64
	for _, v := range vols {
		if v.Digest == fresh {
			budget = v.Size
		}
	}
	o.leave() // as the command does before it collects
	rep, err := o.b.CollectCaches(context.Background(), broker.CachePolicy{VolumeBudget: budget, MinAge: floor})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.volumes(t); !slices.Equal(got, []string{fresh}) {
		t.Errorf("after the collection: volumes %v, want only the fresh one %s (report %+v)", got, fresh, rep)
	}
	if o.blobs.Has(old1) || o.blobs.Has(old2) || !o.blobs.Has(fresh) {
		t.Errorf("blobs: old1 %v, old2 %v, fresh %v; want only the fresh one kept (report %+v)", o.blobs.Has(old1), o.blobs.Has(old2), o.blobs.Has(fresh), rep.Blobs)
	}
	// The next run of an old input stages it again.
	old1 = o.input(t, "old1", "old one")
	before := o.b.Stats().VolumesPopulated.Load()
	o.cat(t, old1, "old1", "old one")
	if got := o.b.Stats().VolumesPopulated.Load() - before; got != 1 {
		t.Errorf("populated %d volumes for the evicted input, want 1", got)
	}
}

// hookedEngine is the engine, with what another process does on it just
// before a job's container is created and just after it starts.
type hookedEngine struct {
	broker.Engine
	beforeCreate func()
	afterStart   func()
}

func (h *hookedEngine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	if o.Config != nil && o.Config.Labels[broker.LabelRole] == "job" && h.beforeCreate != nil {
		h.beforeCreate()
	}
	return h.Engine.ContainerCreate(ctx, o)
}

func (h *hookedEngine) ContainerStart(ctx context.Context, id string, o client.ContainerStartOptions) (client.ContainerStartResult, error) {
	r, err := h.Engine.ContainerStart(ctx, id, o)
	if err == nil && h.afterStart != nil {
		h.afterStart()
	}
	return r, err
}

// Two one-shot processes of one broker name on two states: the second
// one's collection, which sees nothing of the first's use (another
// state's check records, its pins in another process), removes the input
// volume the first one just checked, before its job's container mounts
// it, and tries again while the job runs on it. The job stages the
// volume again, the engine refuses to remove it while it is mounted, and
// the job succeeds.
func TestOneShotCollectionOfAnotherStateSparesRunningJobs(t *testing.T) {
	t.Parallel()
	name := oneShotName(t)
	other := newOneShot(t, env.Eng, name)
	policy := broker.CachePolicy{VolumeBudget: 0, MinAge: time.Nanosecond} // everything idle goes
	var mu sync.Mutex
	var reports []broker.VolumeReport
	collect := func() {
		rep, err := other.b.CollectCaches(context.Background(), policy)
		if err != nil {
			t.Errorf("the other process's collection: %v", err)
		}
		mu.Lock()
		reports = append(reports, rep.Volumes)
		mu.Unlock()
	}
	hooked := &hookedEngine{Engine: env.Eng}
	first := true
	hooked.beforeCreate = func() {
		if first {
			first = false
			collect()
		}
	}
	hooked.afterStart = collect
	o := newOneShot(t, hooked, name)
	in := o.input(t, "tests", "hidden tests")
	j := newJob(t, sh("sleep 2; cat /bundle/tests"), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: in, Path: sandbox.BundlePath}}
	})
	r := env.Run(t, o.b, j)
	if got := o.stdout(r); r.Status != sandbox.StatusSucceeded || got != "hidden tests" {
		t.Fatalf("got %s (%s) %q, want succeeded with the input's content", r.Status, r.Cause, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 || reports[0].Evicted != 1 || reports[1].Evicted != 0 {
		t.Errorf("the other process's collections: %+v; want the checked volume removed before the mount, none while the job ran", reports)
	}
	if populated := o.b.Stats().VolumesPopulated.Load(); populated != 2 {
		t.Errorf("populated %d times, want twice (first, then after the removal)", populated)
	}
}
