package broker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

var _ Engine = (*enginefake.Engine)(nil)

var fakeImage = "sha256:" + strings.Repeat("c", 64)

// newFakeBroker is a broker on an in-memory engine whose containers run a
// fake helper that answers every job with "hi" on stdout and exit 0.
func newFakeBroker(t *testing.T, poolSize int) (*Broker, *enginefake.Engine) {
	t.Helper()
	dir := t.TempDir()
	shimPath := filepath.Join(dir, "sandboxd-shim")
	if err := os.WriteFile(shimPath, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	eng := enginefake.New()
	eng.AddImage(fakeImage)
	eng.Program = enginefake.Helper("hi", shim.Status{}, nil)
	cfg := Default()
	cfg.ShimPath = shimPath
	cfg.EngineTimeout = 10 * time.Second
	cfg.PoolSize = poolSize
	b, err := New(eng, blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.ClosePool)
	return b, eng
}

func fakeJob(t *testing.T, id string, mod ...func(*sandbox.Job)) sandbox.Job {
	t.Helper()
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: id, Image: fakeImage, Argv: []string{"true"}, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc}
	for _, m := range mod {
		m(&j)
	}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

// runJob runs a job and returns its result and the container it got.
func runJob(t *testing.T, b *Broker, job sandbox.Job) (sandbox.Result, string) {
	t.Helper()
	var mu sync.Mutex
	var id string
	res, err := b.RunWithHooks(context.Background(), job, Hooks{OnCreated: func(_ context.Context, cid string) error {
		mu.Lock()
		id = cid
		mu.Unlock()
		return nil
	}})
	if err != nil {
		t.Fatalf("RunWithHooks: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return res, id
}

// The fake engine carries a job through the real broker: this is what the
// tests below change one thing of.
func TestFakeEngineRunsAJob(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	res, id := runJob(t, b, fakeJob(t, "job-1"))
	if res.Status != sandbox.StatusSucceeded || res.Stdout.Bytes != 2 {
		t.Fatalf("got %s (%s) with %d stdout bytes, want succeeded with 2", res.Status, res.Cause, res.Stdout.Bytes)
	}
	if eng.Called("ContainerStart", id) != 1 {
		t.Errorf("container %s started %d times, want once", id, eng.Called("ContainerStart", id))
	}
	if eng.Container(id) != nil {
		t.Errorf("container %s still exists after the job", id)
	}
	if res.Security.Privileged || !res.Security.NoNewPrivs || res.Security.NetworkMode != "none" {
		t.Errorf("got security %+v, want what was inspected", res.Security)
	}
}

// inspectChange is one way an engine could report a container other than
// the broker asked for: each must refuse the job before it starts.
type inspectChange struct {
	setting string
	change  func(*container.InspectResponse)
}

func securityChanges() []inspectChange {
	hc := func(f func(*container.HostConfig)) func(*container.InspectResponse) {
		return func(r *container.InspectResponse) { f(r.HostConfig) }
	}
	cfg := func(f func(*container.Config)) func(*container.InspectResponse) {
		return func(r *container.InspectResponse) { f(r.Config) }
	}
	other := int64(1)
	no := false
	return []inspectChange{
		{"Privileged", hc(func(h *container.HostConfig) { h.Privileged = true })},
		{"CapDrop", hc(func(h *container.HostConfig) { h.CapDrop = nil })},
		{"CapAdd", hc(func(h *container.HostConfig) { h.CapAdd = append(h.CapAdd, "SYS_ADMIN") })},
		{"SecurityOpt", hc(func(h *container.HostConfig) { h.SecurityOpt = h.SecurityOpt[1:] })}, // no no-new-privileges
		{"SecurityOpt", hc(func(h *container.HostConfig) {
			h.SecurityOpt = []string{"no-new-privileges:true", "seccomp=unconfined"}
		})},
		{"ReadonlyRootfs", hc(func(h *container.HostConfig) { h.ReadonlyRootfs = false })},
		{"NetworkMode", hc(func(h *container.HostConfig) { h.NetworkMode = "host" })},
		{"Dns", hc(func(h *container.HostConfig) { h.DNS = []netip.Addr{netip.MustParseAddr("8.8.8.8")} })},
		{"DnsOptions", hc(func(h *container.HostConfig) { h.DNSOptions = []string{"ndots:1"} })},
		{"DnsSearch", hc(func(h *container.HostConfig) { h.DNSSearch = []string{"example.com"} })},
		{"ExtraHosts", hc(func(h *container.HostConfig) { h.ExtraHosts = []string{"host:10.0.0.1"} })},
		{"IpcMode", hc(func(h *container.HostConfig) { h.IpcMode = "host" })},
		{"CgroupnsMode", hc(func(h *container.HostConfig) { h.CgroupnsMode = "host" })},
		{"PidMode", hc(func(h *container.HostConfig) { h.PidMode = "host" })},
		{"UTSMode", hc(func(h *container.HostConfig) { h.UTSMode = "host" })},
		{"UsernsMode", hc(func(h *container.HostConfig) { h.UsernsMode = "host" })},
		{"Memory", hc(func(h *container.HostConfig) { h.Memory = 0 })},
		{"MemorySwap", hc(func(h *container.HostConfig) { h.MemorySwap = -1 })},
		{"NanoCPUs", hc(func(h *container.HostConfig) { h.NanoCPUs = 0 })},
		{"PidsLimit", hc(func(h *container.HostConfig) { h.PidsLimit = nil })},
		{"PidsLimit", hc(func(h *container.HostConfig) { h.PidsLimit = &other })},
		{"OomScoreAdj", hc(func(h *container.HostConfig) { h.OomScoreAdj = -1000 })},
		{"Ulimits", hc(func(h *container.HostConfig) { h.Ulimits = h.Ulimits[1:] })},
		{"Init", hc(func(h *container.HostConfig) { h.Init = &no })},
		{"Init", hc(func(h *container.HostConfig) { h.Init = nil })},
		{"RestartPolicy", hc(func(h *container.HostConfig) { h.RestartPolicy.Name = container.RestartPolicyAlways })},
		{"AutoRemove", hc(func(h *container.HostConfig) { h.AutoRemove = true })},
		{"LogConfig", hc(func(h *container.HostConfig) { h.LogConfig.Type = "json-file" })},
		{"Devices", hc(func(h *container.HostConfig) {
			h.Devices = []container.DeviceMapping{{PathOnHost: "/dev/kmsg", PathInContainer: "/dev/kmsg", CgroupPermissions: "rwm"}}
		})},
		{"DeviceRequests", hc(func(h *container.HostConfig) { h.DeviceRequests = []container.DeviceRequest{{Count: -1}} })},
		{"DeviceCgroupRules", hc(func(h *container.HostConfig) { h.DeviceCgroupRules = []string{"c *:* rwm"} })},
		{"PublishAllPorts", hc(func(h *container.HostConfig) { h.PublishAllPorts = true })},
		{"Binds", hc(func(h *container.HostConfig) { h.Binds = []string{"/:/host"} })},
		{"VolumesFrom", hc(func(h *container.HostConfig) { h.VolumesFrom = []string{"other"} })},
		{"Links", hc(func(h *container.HostConfig) { h.Links = []string{"other:other"} })},
		{"Sysctls", hc(func(h *container.HostConfig) { h.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"} })},
		{"GroupAdd", hc(func(h *container.HostConfig) { h.GroupAdd = []string{"0"} })},
		{"Tmpfs", hc(func(h *container.HostConfig) { h.Tmpfs[sandbox.TmpPath] = "rw,exec,size=1g" })},
		{"Mounts", hc(func(h *container.HostConfig) { h.Mounts[0].ReadOnly = false })},
		{"Mounts", func(r *container.InspectResponse) { // an image VOLUME: an extra, writable mount
			r.Mounts = append(r.Mounts, container.MountPoint{Type: mount.TypeVolume, Name: "anon", Destination: "/data", RW: true})
		}},
		{"Mounts", func(r *container.InspectResponse) { r.Mounts[0].RW = true }},
		{"MaskedPaths", hc(func(h *container.HostConfig) { h.MaskedPaths = nil })},
		{"ReadonlyPaths", hc(func(h *container.HostConfig) { h.ReadonlyPaths = []string{} })},
		{"Runtime", hc(func(h *container.HostConfig) { h.Runtime = "crun" })},
		{"User", cfg(func(c *container.Config) { c.User = "1000" })},
		{"Entrypoint", cfg(func(c *container.Config) { c.Entrypoint = []string{"/bin/sh"} })},
		{"Tty", cfg(func(c *container.Config) { c.Tty = true })},
		{"Image", func(r *container.InspectResponse) { r.Image = "sha256:" + strings.Repeat("d", 64) }},
		{"HostConfig", func(r *container.InspectResponse) { r.HostConfig = nil }},
	}
}

// A container whose inspected settings differ from the job's spec in any
// security-relevant field is refused before it starts, and removed.
func TestSpecMismatchIsRefusedBeforeStart(t *testing.T) {
	for _, tc := range securityChanges() {
		t.Run(tc.setting, func(t *testing.T) {
			b, eng := newFakeBroker(t, 0)
			eng.Inspect = func(r *container.InspectResponse) {
				if r.Config.Labels[LabelRole] == roleJob {
					tc.change(r)
				}
			}
			res, id := runJob(t, b, fakeJob(t, "job-1"))
			if id == "" {
				t.Fatal("no container was created")
			}
			want := "inspected container setting " + tc.setting + " "
			if res.Status != sandbox.StatusError || !strings.Contains(res.Cause, want) {
				t.Errorf("got %s (%s), want error naming %q", res.Status, res.Cause, want)
			}
			if n := eng.Called("ContainerStart", id); n != 0 {
				t.Errorf("the refused container was started %d times", n)
			}
			if n := eng.Called("ContainerAttach", id); n != 0 {
				t.Errorf("the refused container was attached %d times", n)
			}
			if eng.Container(id) != nil {
				t.Errorf("the refused container %s was not removed", id)
			}
		})
	}
}

// waitPool waits until the pool has finished starting sandboxes.
func waitPool(b *Broker) { b.pool.fills.Wait() }

func TestPoolTakesAMatchingSandbox(t *testing.T) {
	b, eng := newFakeBroker(t, 1)
	if _, first := runJob(t, b, fakeJob(t, "job-1")); first == "" {
		t.Fatal("no container")
	}
	waitPool(b)
	ready, _, _ := b.PoolCounts()
	if ready != 1 {
		t.Fatalf("got %d sandboxes ready after a job of the shape ran, want 1", ready)
	}
	pooledID := b.pool.shapes[onlyKey(t, b)].ready[0].id

	job := fakeJob(t, "job-2", func(j *sandbox.Job) { j.Argv = []string{"echo", "other command, same shape"} })
	res, id := runJob(t, b, job)
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %s (%s), want succeeded", res.Status, res.Cause)
	}
	if id != pooledID {
		t.Errorf("the job ran in %s, want the pooled %s", id, pooledID)
	}
	if n := eng.Called("ContainerRename", pooledID); n != 1 {
		t.Errorf("the pooled sandbox was renamed %d times, want once (to the job's name)", n)
	}
	if _, _, used := b.PoolCounts(); used != 1 {
		t.Errorf("got %d jobs in pooled sandboxes, want 1", used)
	}
	if b.stats.PoolDiscarded.Load() != 0 {
		t.Errorf("got %d discarded, want 0", b.stats.PoolDiscarded.Load())
	}
}

// A container of the job's name that is gone by the time the reclaim
// looks at it (removed since the create conflicted) leaves the name free:
// the create is made once more, and the job runs.
func TestAReclaimedNameGoneSinceTheConflict(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	job := fakeJob(t, "job-1")
	planted := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
	eng.InspectError = func(id string) error {
		if id != planted.ID {
			return nil
		}
		eng.ContainerRemove(context.Background(), id, client.ContainerRemoveOptions{Force: true})
		return fmt.Errorf("no such container: %s: %w", id, errdefs.ErrNotFound)
	}
	res, err := b.RunWithHooks(context.Background(), job, Hooks{ReclaimName: true})
	if err != nil || res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %s (%s), %v; want the job run", res.Status, res.Cause, err)
	}
}

// A pooled sandbox whose state the engine cannot read serves no job: the
// job starts cold (before, the job failed).
func TestPoolSandboxThatCannotBeInspectedIsNotTaken(t *testing.T) {
	b, eng := newFakeBroker(t, 1)
	runJob(t, b, fakeJob(t, "job-1"))
	waitPool(b)
	pooledID := b.pool.shapes[onlyKey(t, b)].ready[0].id
	eng.InspectError = func(id string) error {
		if id == pooledID {
			return errors.New("task state unreadable")
		}
		return nil
	}
	res, id := runJob(t, b, fakeJob(t, "job-2"))
	if res.Status != sandbox.StatusSucceeded || id == pooledID || id == "" {
		t.Fatalf("got %s (%s) in %q, want succeeded in a cold container", res.Status, res.Cause, id)
	}
	if b.stats.PoolDiscarded.Load() != 1 {
		t.Errorf("got %d discarded, want the uninspectable one", b.stats.PoolDiscarded.Load())
	}
}

// One failed read of an exited container's state does not throw away a
// whole stream: it is read again.
func TestExitedContainerIsInspectedAgain(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	var mu sync.Mutex
	seen := map[string]int{}
	eng.InspectError = func(id string) error {
		mu.Lock()
		defer mu.Unlock()
		seen[id]++
		if seen[id] == 2 { // the first after the exit (the first is the check before start)
			return errors.New("task state unreadable")
		}
		return nil
	}
	res, id := runJob(t, b, fakeJob(t, "job-1"))
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %s (%s), want succeeded", res.Status, res.Cause)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[id] < 3 {
		t.Errorf("%d inspects of the job's container, want one more after the failed one", seen[id])
	}
}

// A job of another shape never takes a pooled sandbox.
func TestPoolIgnoresAnotherShape(t *testing.T) {
	b, _ := newFakeBroker(t, 1)
	runJob(t, b, fakeJob(t, "job-1"))
	waitPool(b)
	pooledID := b.pool.shapes[onlyKey(t, b)].ready[0].id
	other := fakeJob(t, "job-2", func(j *sandbox.Job) { j.Limits.MemoryBytes /= 2 })
	if _, id := runJob(t, b, other); id == pooledID {
		t.Errorf("a job with another memory limit ran in the pooled sandbox %s", id)
	}
	if _, _, used := b.PoolCounts(); used != 0 {
		t.Errorf("got %d jobs in pooled sandboxes, want 0", used)
	}
}

func onlyKey(t *testing.T, b *Broker) string {
	t.Helper()
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	if len(b.pool.shapes) != 1 {
		t.Fatalf("got %d pool shapes, want 1", len(b.pool.shapes))
	}
	for k := range b.pool.shapes {
		return k
	}
	return ""
}

// A pooled sandbox that changed since it was pooled is discarded, and the
// job runs in a cold container checked in turn.
func TestPoolDiscardsAChangedSandbox(t *testing.T) {
	tests := []struct {
		name   string
		change func(eng *enginefake.Engine, c *enginefake.Container)
	}{
		{"exited", func(eng *enginefake.Engine, c *enginefake.Container) {
			eng.ContainerKill(context.Background(), c.ID, client.ContainerKillOptions{Signal: "SIGKILL"})
		}},
		{"oom killed", func(_ *enginefake.Engine, c *enginefake.Container) {
			s := c.State()
			s.OOMKilled = true
			c.SetState(s)
		}},
		{"removed", func(eng *enginefake.Engine, c *enginefake.Container) {
			eng.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
		}},
		{"settings changed", func(eng *enginefake.Engine, c *enginefake.Container) {
			eng.Inspect = func(r *container.InspectResponse) {
				if r.ID == c.ID {
					r.HostConfig.Privileged = true
				}
			}
		}},
		{"labels changed", func(eng *enginefake.Engine, c *enginefake.Container) {
			eng.Inspect = func(r *container.InspectResponse) {
				if r.ID == c.ID {
					r.Config.Labels[LabelStream] = "another stream"
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, eng := newFakeBroker(t, 1)
			runJob(t, b, fakeJob(t, "job-1"))
			waitPool(b)
			pooledID := b.pool.shapes[onlyKey(t, b)].ready[0].id
			tt.change(eng, eng.Container(pooledID))

			res, id := runJob(t, b, fakeJob(t, "job-2"))
			if id == pooledID {
				t.Fatalf("the job ran in the changed pooled sandbox")
			}
			if tt.name == "settings changed" {
				// The cold container is inspected with the same engine: it
				// is fine; only the pooled one was changed.
				if res.Status != sandbox.StatusSucceeded {
					t.Errorf("got %s (%s), want the cold container to run it", res.Status, res.Cause)
				}
			} else if res.Status != sandbox.StatusSucceeded {
				t.Errorf("got %s (%s), want succeeded in a cold container", res.Status, res.Cause)
			}
			if got := b.stats.PoolDiscarded.Load(); got != 1 {
				t.Errorf("got %d discarded, want 1", got)
			}
			if eng.Container(pooledID) != nil {
				t.Errorf("the changed pooled sandbox %s still exists", pooledID)
			}
			if n := eng.Called("ContainerRename", pooledID); n != 0 {
				t.Errorf("the changed pooled sandbox was renamed to the job's name")
			}
			if _, _, used := b.PoolCounts(); used != 0 {
				t.Errorf("got %d jobs in pooled sandboxes, want 0", used)
			}
		})
	}
}

// jobContainer makes the container a broker would have created for job,
// as found after a restart: labelled, with the deadline label given.
func jobContainer(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job, deadline time.Time) *enginefake.Container {
	t.Helper()
	return jobContainerWith(t, b, eng, job, deadline, nil)
}

// jobContainerWith is jobContainer with the image's trees mounted.
func jobContainerWith(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job, deadline time.Time, trees []string) *enginefake.Container {
	t.Helper()
	labels := map[string]string{
		LabelJob: job.ID, LabelJobDigest: job.Digest, LabelDeadline: strconv.FormatInt(deadline.UnixMilli(), 10),
		LabelBroker: b.cfg.Name, LabelRole: roleJob, LabelStream: "fedcba9876543210",
	}
	// The helper volume first, as a run makes it: a named mount of a
	// missing volume would make the engine create it empty and unlabelled.
	if _, err := b.ensureShim(context.Background(), job.Image); err != nil {
		t.Fatal(err)
	}
	spec := b.containerSpec(b.planFor(&job, labels, trees))
	created, err := eng.ContainerCreate(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return eng.Container(created.ID)
}

func exitedState(code int) container.State {
	now := time.Now().UTC()
	return container.State{Status: container.StateExited, ExitCode: code,
		StartedAt: now.Add(-time.Second).Format(time.RFC3339Nano), FinishedAt: now.Format(time.RFC3339Nano)}
}

func TestRecoveryDecisions(t *testing.T) {
	whole := func(c *enginefake.Container, code int) []byte {
		return enginefake.Mux(1, enginefake.Stream(enginefake.Nonce(c), "out", shim.Status{ExitCode: code}))
	}
	tests := []struct {
		name       string
		setup      func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string // the container id to recover
		wantStatus sandbox.Status
		wantCause  string
		wantKept   bool // the container is not removed
	}{
		{"exited with a whole stream: collected", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			c.SetState(exitedState(0))
			c.SetLog(whole(c, 3))
			return c.ID
		}, sandbox.StatusFailed, "", false},
		{"exited, its image's trees mounted: collected", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			// Created where the image's trees were served from volumes
			// (this broker, on this engine, serves none now): recovery
			// takes them from the container, as it was made.
			c := jobContainerWith(t, b, eng, job, time.Now().Add(time.Hour), []string{"/opt/a", "/opt/b"})
			c.SetState(exitedState(0))
			c.SetLog(whole(c, 3))
			return c.ID
		}, sandbox.StatusFailed, "", false},
		{"a tree mount of another image: uncertain", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			c.SetState(exitedState(0))
			c.SetLog(whole(c, 0))
			eng.Inspect = func(r *container.InspectResponse) {
				m := mount.Mount{Type: mount.TypeVolume, Source: b.treeVolumeName(strings.Replace(job.Image, "c", "d", 1), "/opt/a"), Target: "/opt/a", ReadOnly: true}
				r.HostConfig.Mounts = append(r.HostConfig.Mounts, m)
			}
			return c.ID
		}, sandbox.StatusUncertain, "inspected container setting Mounts", false},
		{"exited, stream cut short: uncertain", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			c.SetState(exitedState(0))
			w := whole(c, 0)
			c.SetLog(w[:len(w)-10])
			return c.ID
		}, sandbox.StatusUncertain, "could not be recovered whole", false},
		{"no container: uncertain", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			return strings.Repeat("e", 64)
		}, sandbox.StatusUncertain, "container is gone", false},
		{"another job's container: refused, not removed", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			c := jobContainer(t, b, eng, fakeJob(t, "other-job"), time.Now().Add(time.Hour))
			c.SetState(exitedState(0))
			return c.ID
		}, sandbox.StatusUncertain, "does not carry this job's labels", true},
		{"settings changed: uncertain", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			c.SetState(exitedState(0))
			c.SetLog(whole(c, 0))
			eng.Inspect = func(r *container.InspectResponse) { r.HostConfig.Privileged = true }
			return c.ID
		}, sandbox.StatusUncertain, "inspected container setting Privileged", false},
		{"said created with a start time, no log: uncertain, never run again", func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) string {
			// An engine that reports a started container as created (the
			// containerd engine did, for one whose task it could not read)
			// is not taken at its word: the job is not proven unrun.
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			c.SetState(container.State{Status: container.StateCreated, StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
			return c.ID
		}, sandbox.StatusUncertain, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, eng := newFakeBroker(t, 0)
			job := fakeJob(t, "job-1")
			id := tt.setup(t, b, eng, job)
			var finished []sandbox.Result
			res, err := b.RecoverWithHooks(context.Background(), job, Binding{ContainerID: id}, Hooks{
				OnFinished: func(_ context.Context, r sandbox.Result) error { finished = append(finished, r); return nil },
			})
			if err != nil {
				t.Fatalf("RecoverWithHooks: %v", err)
			}
			if res.Status != tt.wantStatus || !strings.Contains(res.Cause, tt.wantCause) {
				t.Errorf("got %s (%s), want %s naming %q", res.Status, res.Cause, tt.wantStatus, tt.wantCause)
			}
			if tt.wantStatus == sandbox.StatusFailed && (res.ExitCode != 3 || res.Stdout.Bytes != 3) {
				t.Errorf("got exit %d with %d stdout bytes, want the stream's exit 3 and 3 bytes", res.ExitCode, res.Stdout.Bytes)
			}
			if len(finished) != 1 || finished[0].Status != res.Status {
				t.Errorf("OnFinished saw %d results, want the one returned", len(finished))
			}
			if kept := eng.Container(id) != nil; kept != tt.wantKept {
				t.Errorf("container kept: got %v, want %v", kept, tt.wantKept)
			}
			if n := eng.Called("ContainerStart", id); n != 0 {
				t.Errorf("recovery started the container %d times; it never starts anything", n)
			}
		})
	}
}

// A job whose container never started, or whose helper's stream ends
// before the frame it writes just before the command starts, provably
// never ran: recovery removes its container and says ErrNotRun (the
// daemon then runs it for the first time), and records no result. A
// stream past that frame is never taken for one.
func TestRecoveryProvesNotRun(t *testing.T) {
	stuffed := func(frames func(w io.Writer)) []byte {
		var b bytes.Buffer
		frames(shim.NewStuffWriter(&b))
		return enginefake.Mux(1, b.Bytes())
	}
	tests := []struct {
		name    string
		state   *container.State // nil: created, never started
		log     func(c *enginefake.Container) []byte
		notRun  bool
		removed bool
	}{
		{"created, never started", nil, nil, true, true},
		{"exited with an empty log: uncertain (a lost log proves nothing)", ptr(exitedState(1)), func(*enginefake.Container) []byte { return nil }, false, true},
		{"exited, the record after the hello cut short: uncertain", ptr(exitedState(1)), func(c *enginefake.Container) []byte {
			hello := stuffed(func(w io.Writer) { shim.WriteFrame(w, shim.FrameHello, []byte(shim.Hello+enginefake.Nonce(c))) })
			rest := stuffed(func(w io.Writer) {
				shim.WriteFrame(w, shim.FrameStarting, nil)
				shim.WriteFrame(w, shim.FrameStdout, []byte("ran"))
			})
			return append(hello, rest[:len(rest)-2]...)
		}, false, true},
		{"exited after the hello alone (stdin closed before the config)", ptr(exitedState(1)), func(c *enginefake.Container) []byte {
			return stuffed(func(w io.Writer) { shim.WriteFrame(w, shim.FrameHello, []byte(shim.Hello+enginefake.Nonce(c))) })
		}, true, true},
		{"exited with the helper's error before the start (staging cut)", ptr(exitedState(1)), func(c *enginefake.Container) []byte {
			return stuffed(func(w io.Writer) {
				shim.WriteFrame(w, shim.FrameHello, []byte(shim.Hello+enginefake.Nonce(c)))
				shim.WriteFrame(w, shim.FrameError, []byte("stage inputs: exit status 1"))
			})
		}, true, true},
		{"exited after the start, stream cut: uncertain", ptr(exitedState(0)), func(c *enginefake.Container) []byte {
			return stuffed(func(w io.Writer) {
				shim.WriteFrame(w, shim.FrameHello, []byte(shim.Hello+enginefake.Nonce(c)))
				shim.WriteFrame(w, shim.FrameStarting, nil)
			})
		}, false, true},
		{"a stream that is not the helper's: uncertain", ptr(exitedState(0)), func(c *enginefake.Container) []byte {
			return stuffed(func(w io.Writer) { shim.WriteFrame(w, shim.FrameHello, []byte(shim.Hello+"another")) })
		}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, eng := newFakeBroker(t, 0)
			job := fakeJob(t, "job-1")
			c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
			if tt.state != nil {
				c.SetState(*tt.state)
			}
			if tt.log != nil {
				c.SetLog(tt.log(c))
			}
			finished := 0
			res, err := b.RecoverWithHooks(context.Background(), job, Binding{ContainerID: c.ID}, Hooks{
				OnFinished: func(context.Context, sandbox.Result) error { finished++; return nil },
			})
			if got := errors.Is(err, ErrNotRun); got != tt.notRun {
				t.Fatalf("got %v (%s %s), want ErrNotRun %v", err, res.Status, res.Cause, tt.notRun)
			}
			if tt.notRun && finished != 0 {
				t.Errorf("a job that never ran got %d results recorded", finished)
			}
			if !tt.notRun && (res.Status != sandbox.StatusUncertain || finished != 1) {
				t.Errorf("got %s with %d results recorded, want one uncertain", res.Status, finished)
			}
			if removed := eng.Container(c.ID) == nil; removed != tt.removed {
				t.Errorf("container removed: got %v, want %v", removed, tt.removed)
			}
			if n := eng.Called("ContainerStart", c.ID); n != 0 {
				t.Errorf("recovery started the container %d times; it never starts anything", n)
			}
		})
	}
	// Its name must be free for the first run: a container that cannot be
	// removed is kept for the next start, and the job is not said unrun.
	b, eng := newFakeBroker(t, 0)
	job := fakeJob(t, "job-1")
	c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
	eng.RemoveError = errors.New("device busy")
	_, err := b.RecoverWithHooks(context.Background(), job, Binding{ContainerID: c.ID}, Hooks{})
	if err == nil || errors.Is(err, ErrNotRun) || eng.Container(c.ID) == nil {
		t.Errorf("removal failed: got %v, container kept %v; want an error that is not ErrNotRun and the container kept", err, eng.Container(c.ID) != nil)
	}
}

func ptr[T any](v T) *T { return &v }

// A container still running at recovery is waited for, up to the deadline
// its label carries; past it, it is killed and the job timed out.
func TestRecoveryReattachesWithTheDeadline(t *testing.T) {
	tests := []struct {
		name       string
		deadline   time.Duration // from now
		wantKilled bool
		wantStatus sandbox.Status
	}{
		{"within its deadline: waited for", time.Hour, false, sandbox.StatusSucceeded},
		{"past its deadline: killed", -time.Second, true, sandbox.StatusTimedOut},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, eng := newFakeBroker(t, 0)
			job := fakeJob(t, "job-1")
			c := jobContainer(t, b, eng, job, time.Now().Add(tt.deadline))
			// The helper wrote its whole stream and has not exited yet:
			// only the end of the container decides.
			release, wrote := make(chan struct{}), make(chan struct{})
			eng.Program = func(c *enginefake.Container, _ io.Reader, out, _ io.Writer) int {
				out.Write(enginefake.Stream(enginefake.Nonce(c), "", shim.Status{}))
				close(wrote)
				select {
				case <-release:
				case <-c.Exited():
				}
				return 0
			}
			if _, err := eng.ContainerStart(context.Background(), c.ID, client.ContainerStartOptions{}); err != nil {
				t.Fatal(err)
			}
			<-wrote
			done := make(chan sandbox.Result, 1)
			go func() {
				res, err := b.Recover(context.Background(), job, c.ID)
				if err != nil {
					t.Errorf("Recover: %v", err)
				}
				done <- res
			}()
			if !tt.wantKilled {
				waitForCall(t, eng, "ContainerWait", c.ID)
				if n := eng.Called("ContainerKill", c.ID); n != 0 {
					t.Fatalf("killed %d times within its deadline", n)
				}
				close(release)
			}
			res := <-done
			if res.Status != tt.wantStatus {
				t.Errorf("got %s (%s), want %s", res.Status, res.Cause, tt.wantStatus)
			}
			if killed := eng.Called("ContainerKill", c.ID) > 0; killed != tt.wantKilled {
				t.Errorf("killed: got %v, want %v", killed, tt.wantKilled)
			}
			if eng.Container(c.ID) != nil {
				t.Errorf("the recovered container was not removed")
			}
		})
	}
}

// waitForCall waits until the broker has made a call (it runs in another
// goroutine); the test's own timeout bounds it.
func waitForCall(t *testing.T, eng *enginefake.Engine, method, id string) {
	t.Helper()
	for eng.Called(method, id) == 0 {
		time.Sleep(time.Millisecond)
	}
}

// What the reaper decides from: every labelled job container, known or
// not, with its creation time and deadline label; pooled sandboxes of
// another process, never this one's live ones.
func TestListingForTheReaper(t *testing.T) {
	b, eng := newFakeBroker(t, 1)
	deadline := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli())
	unknown := jobContainer(t, b, eng, fakeJob(t, "nobody-knows"), deadline)
	old := time.Unix(time.Now().Add(-3*time.Hour).Unix(), 0)
	unknown.SetCreated(old)
	cs, err := b.ListJobContainers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].ID != unknown.ID || cs[0].JobID != "nobody-knows" || !cs[0].Deadline.Equal(deadline) || !cs[0].Created.Equal(old) {
		t.Fatalf("got %+v, want the unknown container with its deadline %v and creation %v", cs, deadline, old)
	}

	runJob(t, b, fakeJob(t, "job-1"))
	waitPool(b)
	live := b.pool.shapes[onlyKey(t, b)].ready[0].id
	// A pooled sandbox of an earlier process of the same broker.
	foreign := eng.Container(live)
	spec := b.containerSpec(b.planFor(&sandbox.Job{Image: fakeImage, Limits: sandbox.DefaultLimits(), Runtime: sandbox.RuntimeRunc}, map[string]string{
		LabelBroker: b.cfg.Name, LabelRole: rolePool, LabelPool: "an-earlier-generation", LabelPoolKey: "k", LabelStream: "s",
	}, nil))
	spec.Name = "sandboxd-pool-earlier"
	created, err := eng.ContainerCreate(context.Background(), spec)
	if err != nil || foreign == nil {
		t.Fatal(err)
	}
	stale, err := b.ListStalePoolContainers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].ID != created.ID {
		t.Errorf("got stale %+v, want only the earlier process's %s (never the live %s)", stale, created.ID, live)
	}
}

func TestFakeEngineRefusesAConflictingJob(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	job := fakeJob(t, "job-1")
	c := jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
	_, err := b.Run(context.Background(), job)
	if !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("got %v, want the job refused: a container of it exists", err)
	}
	if eng.Container(c.ID) == nil {
		t.Errorf("the existing container was removed")
	}
}

// A job a restart queued again, dispatched with no container bound
// (Hooks.ReclaimName): a create or rename the killed process sent may land
// after the restart freed the job's container name. What that process
// left there (a container of the job that never started, a sandbox an
// earlier process kept ready) is removed and the job runs once; without
// the proof, or with anything else of the name, the run is refused and
// the container kept.
func TestAReclaimedNameTakesOnlyWhatTheDispatcherLeft(t *testing.T) {
	neverStarted := func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) *enginefake.Container {
		return jobContainer(t, b, eng, job, time.Now().Add(time.Hour))
	}
	ranAndExited := func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) *enginefake.Container {
		c := neverStarted(t, b, eng, job)
		c.SetState(exitedState(0))
		return c
	}
	running := container.State{Status: container.StateRunning, Running: true, StartedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	keptReadyBy := func(generation string) func(*testing.T, *Broker, *enginefake.Engine, sandbox.Job) *enginefake.Container {
		return func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) *enginefake.Container {
			if _, err := b.ensureShim(context.Background(), job.Image); err != nil {
				t.Fatal(err)
			}
			spec := b.containerSpec(b.planFor(&job, map[string]string{
				LabelBroker: b.cfg.Name, LabelRole: rolePool, LabelPool: generation, LabelPoolKey: "k", LabelStream: "s",
			}, nil))
			spec.Name = ContainerName(b.cfg.Name, job.ID, job.Digest) // renamed to the job's
			created, err := eng.ContainerCreate(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			c := eng.Container(created.ID)
			c.SetState(running)
			return c
		}
	}
	otherBroker := func(t *testing.T, b *Broker, eng *enginefake.Engine, job sandbox.Job) *enginefake.Container {
		c := keptReadyBy("an-earlier-generation")(t, b, eng, job)
		c.Config.Labels[LabelBroker] = "another-broker"
		return c
	}
	cases := []struct {
		name    string
		plant   func(*testing.T, *Broker, *enginefake.Engine, sandbox.Job) *enginefake.Container
		reclaim bool
		wantRun bool
		pooled  bool // the job takes a pooled sandbox: its rename meets the name
	}{
		{"a create of the job that never started", neverStarted, true, true, false},
		{"an earlier process's sandbox kept ready", keptReadyBy("an-earlier-generation"), true, true, false},
		{"a create met by a pooled sandbox's rename", neverStarted, true, true, true},
		{"without the caller's proof", neverStarted, false, false, false},
		{"without the caller's proof, met by a rename", neverStarted, false, false, true},
		{"a container of the job that started", ranAndExited, true, false, false},
		{"another broker's sandbox", otherBroker, true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, eng := newFakeBroker(t, 0)
			if tc.pooled {
				b, eng = newFakeBroker(t, 1)
				runJob(t, b, fakeJob(t, "job-0")) // the pool learns the shape
				waitPool(b)
			}
			job := fakeJob(t, "job-1")
			planted := tc.plant(t, b, eng, job)
			before := len(eng.Calls())
			res, err := b.RunWithHooks(context.Background(), job, Hooks{ReclaimName: tc.reclaim})
			if !tc.wantRun {
				if !errors.Is(err, sandbox.ErrConflict) || eng.Container(planted.ID) == nil {
					t.Fatalf("got %v (container kept: %v), want the run refused as a conflict and the container kept", err, eng.Container(planted.ID) != nil)
				}
				for _, c := range eng.Calls()[before:] {
					if strings.HasPrefix(c, "ContainerStart ") {
						t.Errorf("%s, want no start", c)
					}
				}
				return
			}
			if err != nil || res.Status != sandbox.StatusSucceeded {
				t.Fatalf("got %s (%s), %v; want the job run", res.Status, res.Cause, err)
			}
			if eng.Container(planted.ID) != nil {
				t.Error("what the earlier process left is still there")
			}
			if renamed := slices.ContainsFunc(eng.Calls()[before:], func(c string) bool { return strings.HasPrefix(c, "ContainerRename ") }); renamed != tc.pooled {
				t.Errorf("a pooled sandbox renamed: %v, want %v", renamed, tc.pooled)
			}
		})
	}
}

// A cache volume the broker did not create (no nonce label) is rebuilt, not
// a dead end: the engine makes such a volume, empty, when a container names
// a volume that was removed meanwhile, and every later job failed with "it
// changed while it was checked" until someone removed it by hand.
func TestCacheVolumeWithoutNonceIsRebuilt(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	ctx := context.Background()
	if res, _ := runJob(t, b, fakeJob(t, "job-1")); res.Status != sandbox.StatusSucceeded {
		t.Fatalf("first job: got %s (%s), want succeeded", res.Status, res.Cause)
	}
	list, err := eng.VolumeList(ctx, client.VolumeListOptions{})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("got %d volumes (%v), want the broker's cache volumes", len(list.Items), err)
	}
	for _, v := range list.Items {
		labels := maps.Clone(v.Labels)
		delete(labels, LabelNonce)
		if _, err := eng.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.VolumeCreate(ctx, client.VolumeCreateOptions{Name: v.Name, Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	b2, err := New(eng, b.blobs, b.cfg) // a new process: nothing remembered
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b2.ClosePool)
	res, _ := runJob(t, b2, fakeJob(t, "job-2"))
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %s (%s), want succeeded on rebuilt volumes", res.Status, res.Cause)
	}
	after, err := eng.VolumeList(ctx, client.VolumeListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range after.Items {
		if v.Labels[LabelNonce] == "" {
			t.Errorf("volume %s still has no nonce: it was used, not rebuilt", v.Name)
		}
	}
}

// putInput stores a canonical tar of files as a read-only input's blob.
func putInput(t *testing.T, blobs *store.Store, files map[string]string) string {
	t.Helper()
	var entries []sandbox.TreeEntry
	for name, content := range files {
		entries = append(entries, sandbox.TreeEntry{Name: name, Size: int64(len(content)), Open: func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(content)), nil
		}})
	}
	var buf bytes.Buffer
	if _, err := sandbox.WriteTree(&buf, entries); err != nil {
		t.Fatal(err)
	}
	d, err := blobs.PutBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func withInput(name, digest string) func(*sandbox.Job) {
	return func(j *sandbox.Job) {
		j.Inputs = append(j.Inputs, sandbox.Input{Name: name, Digest: digest, Path: sandbox.BundlePath})
	}
}

// Another process of this broker name (a one-shot run on another state)
// removes an idle input volume between this job's check of it and the
// create of its container: the engine then creates the volume empty for
// the container. The job stages its input again and runs, in a container
// that was never the job's before (OnCreated sees only the last one).
func TestVolumeRemovedBeforeMountIsStagedAgain(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	in := putInput(t, b.blobs, map[string]string{"tests/a": "a"})
	vol := b.inputVolumeName(in)
	removed := 0
	eng.BeforeCreate = func(o client.ContainerCreateOptions) {
		if o.Config.Labels[LabelRole] == roleJob && removed < 2 {
			removed++
			if _, err := eng.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{}); err != nil {
				t.Errorf("remove the idle volume: %v", err)
			}
		}
	}
	var created []string
	res, err := b.RunWithHooks(context.Background(), fakeJob(t, "job-1", withInput("bundle", in)), Hooks{OnCreated: func(_ context.Context, id string) error {
		created = append(created, id)
		return nil
	}})
	if err != nil || res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %s (%s), %v; want succeeded after staging again", res.Status, res.Cause, err)
	}
	if got := b.Stats().VolumesPopulated.Load(); got != 3 {
		t.Errorf("populated the input %d times, want 3 (once, then after each removal)", got)
	}
	if len(created) != 1 {
		t.Errorf("OnCreated saw containers %v, want only the one that ran", created)
	}
	if n := len(eng.Containers()); n != 0 {
		t.Errorf("%d containers left", n)
	}
}

// A job's pids limit is the pids cgroup on runc; on runsc, whose cgroup
// counts gVisor's own host tasks, it is RLIMIT_NPROC (gVisor enforces it
// per user inside the sandbox), and the cgroup bounds gVisor's tasks.
func TestRunscPidsLimitIsRLimitNProc(t *testing.T) {
	b, _ := newFakeBroker(t, 0)
	b.cfg.AllowRunsc = true
	for _, tc := range []struct {
		runtime     string
		pids, nproc int64
	}{
		{sandbox.RuntimeRunc, 32, 8192},
		{sandbox.RuntimeRunsc, 4*32 + 256, 32},
	} {
		res, _ := runJob(t, b, fakeJob(t, "job-"+tc.runtime, func(j *sandbox.Job) { j.Runtime = tc.runtime; j.Limits.Pids = 32 }))
		if res.Status != sandbox.StatusSucceeded {
			t.Fatalf("%s: got %s (%s)", tc.runtime, res.Status, res.Cause)
		}
		var nproc int64 = -1
		for _, u := range res.Security.Ulimits {
			if u.Name == "nproc" && u.Soft == u.Hard {
				nproc = u.Soft
			}
		}
		if res.Security.PidsLimit != tc.pids || nproc != tc.nproc {
			t.Errorf("%s: got pids cgroup %d, nproc %d; want %d, %d", tc.runtime, res.Security.PidsLimit, nproc, tc.pids, tc.nproc)
		}
	}
}

// A container whose checked volume went is staged again only once it is
// removed: if the engine fails the removal, the job ends with that error
// instead of creating a second container of its name (a conflict that
// read as the caller's).
func TestVolumeGoneAndRemovalFailedIsNotRetried(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	in := putInput(t, b.blobs, map[string]string{"tests/a": "a"})
	vol := b.inputVolumeName(in)
	removeFailed := errors.New("engine: removal failed")
	eng.BeforeCreate = func(o client.ContainerCreateOptions) {
		if o.Config.Labels[LabelRole] == roleJob {
			eng.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{})
			eng.RemoveError = removeFailed
		}
	}
	res, err := b.RunWithHooks(context.Background(), fakeJob(t, "job-1", withInput("bundle", in)), Hooks{})
	eng.RemoveError = nil
	if err != nil || res.Status != sandbox.StatusError || !strings.Contains(res.Cause, "could not be removed: engine: removal failed") {
		t.Fatalf("got %s (%s), %v; want an error naming the failed removal, not a conflict or a retry", res.Status, res.Cause, err)
	}
	if n := len(eng.Containers()); n != 1 {
		t.Errorf("%d containers, want the one whose removal failed", n)
	}
}

// namingEngine is the fake engine with containerd's rule for names: at
// most 76 characters.
type namingEngine struct{ *enginefake.Engine }

func (namingEngine) CheckContainerName(name string) error {
	if len(name) > 76 || strings.Contains(name, "--") || strings.Contains(name, "..") {
		return errors.New("not an identifier")
	}
	return nil
}

// A job id the engine cannot name its container after is refused at
// admission (Preflight, before a receipt is signed), naming the id; the
// same id on an engine without such a rule is accepted.
func TestPreflightRefusesAJobTheEngineCannotName(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	nb, err := New(namingEngine{eng}, b.blobs, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id string
		ok bool
	}{
		{"job-1", true},
		{strings.Repeat("a", 70), false},
		{"a..b", false},
		{"a-", false},
	} {
		job := fakeJob(t, tt.id)
		err := nb.Preflight(context.Background(), job)
		var fe *sandbox.FieldError
		if tt.ok != (err == nil) || (err != nil && (!errors.As(err, &fe) || fe.Field != "job.id")) {
			t.Errorf("id %q: got %v, want accepted %v (refused naming job.id)", tt.id, err, tt.ok)
		}
		if err := b.Preflight(context.Background(), job); err != nil {
			t.Errorf("id %q on an engine without a naming rule: %v", tt.id, err)
		}
	}
}

// The helper volume is filled with the bytes the broker's digest names, or
// not at all: a helper binary changed on disk after the broker took its
// digest (an upgrade under a running daemon) is refused, never staged
// under the old digest's name.
func TestAHelperChangedOnDiskIsNotStaged(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	if err := os.WriteFile(b.cfg.ShimPath, append(enginefake.ShimBinary(), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background(), fakeJob(t, "changed-helper"))
	if err == nil && res.Status == sandbox.StatusSucceeded {
		t.Fatalf("job ran with a helper changed since its digest was taken: %+v", res)
	}
	if msg := fmt.Sprint(err) + res.Cause; !strings.Contains(msg, "changed since its digest was taken") {
		t.Errorf("error %v, cause %q: want the changed helper named", err, res.Cause)
	}
	if n := b.Stats().VolumesPopulated.Load(); n != 0 {
		t.Errorf("%d volumes populated, want none", n)
	}
	l, err := eng.ContainerList(context.Background(), client.ContainerListOptions{All: true})
	if err != nil || len(l.Items) != 0 {
		t.Errorf("containers left: %v %v", l.Items, err)
	}
	// The bytes the digest names back in place: the refusal was not kept.
	if err := os.WriteFile(b.cfg.ShimPath, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Run(context.Background(), fakeJob(t, "helper-restored")); err != nil || res.Status != sandbox.StatusSucceeded {
		t.Fatalf("after the helper was restored: %v %+v", err, res)
	}
}

// A volume another process created is that process's to fill: this one
// waits while a populate container of that volume exists, never fills it
// too, and uses it once it reads back whole. Without such a container it
// is judged at once: left empty, it is rebuilt.
func TestAVolumeAnotherProcessFillsIsWaitedFor(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	ctx := context.Background()
	in := putInput(t, b.blobs, map[string]string{"tests/a": "a"})
	vol := b.inputVolumeName(in)
	// The other process: its volume (its nonce), and its populate
	// container mounting it.
	if _, err := eng.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: map[string]string{
		LabelRole: roleInput, LabelDigest: in, LabelBroker: b.cfg.Name, LabelNonce: "the-other-process",
	}}); err != nil {
		t.Fatal(err)
	}
	filler, err := eng.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:       "sandboxd-populate-other",
		Config:     &container.Config{Image: fakeImage, Labels: map[string]string{LabelRole: rolePopulate, LabelBroker: b.cfg.Name, LabelVolume: vol}},
		HostConfig: &container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: "/v"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, populated, err := b.ensureInput(ctx, fakeImage, in)
		if err == nil && populated {
			err = errors.New("it filled the other process's volume")
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("did not wait for the other process's fill: %v", err)
	case <-time.After(2 * settleWait):
	}
	// The other process fills it and goes.
	f, err := b.blobs.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.CopyToContainer(ctx, filler.ID, client.CopyToContainerOptions{DestinationPath: "/v", Content: f}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var root bytes.Buffer
	tw := tar.NewWriter(&root)
	tw.WriteHeader(&tar.Header{Name: "v/", Typeflag: tar.TypeDir, Mode: 0o750, Gid: b.cfg.CandidateGID})
	tw.Close()
	if _, err := eng.CopyToContainer(ctx, filler.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: &root, CopyUIDGID: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.ContainerRemove(ctx, filler.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after the other process's fill: %v", err)
	}

	// Another volume of another process, left empty, no one at it:
	// rebuilt by this one.
	in2 := putInput(t, b.blobs, map[string]string{"tests/a": "a", "tests/b": "b"})
	vol2 := b.inputVolumeName(in2)
	if _, err := eng.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol2, Labels: map[string]string{LabelBroker: b.cfg.Name, LabelNonce: "a-dead-process"}}); err != nil {
		t.Fatal(err)
	}
	if _, populated, err := b.ensureInput(ctx, fakeImage, in2); err != nil || !populated {
		t.Fatalf("a volume left empty by a dead process: populated %v, %v; want rebuilt", populated, err)
	}
	if v, err := eng.VolumeInspect(ctx, vol2, client.VolumeInspectOptions{}); err != nil || v.Volume.Labels[LabelNonce] == "a-dead-process" {
		t.Errorf("the dead process's volume: %v, %v; want it rebuilt under a nonce of this one", v.Volume.Labels, err)
	}
}
