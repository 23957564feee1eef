package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/sandbox"
)

// On containerd, a start that fails leaves nothing behind: a runsc whose
// start fails leaves its task CREATED, its sandbox process alive, until
// that process dies (seen with Debian's runsc, which refused to start with
// its network enabled); the job ends in error and the engine holds no
// container, task or sandbox process of it. The runsc is the wrapper
// scripts/setup writes (bin/sandboxd-runsc, the pinned gVisor), never one
// from the PATH, made to fail its start command.
func TestFailedStartLeavesNothing(t *testing.T) {
	if env.Ctr == nil {
		t.Skip("a containerd engine test (SANDBOXD_ENGINE=containerd)")
	}
	runsc := filepath.Join(env.Repo, "bin", "sandboxd-runsc")
	if _, err := os.Stat(runsc); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no runsc wrapper (scripts/setup writes it) and CI=true: %v", err)
		}
		t.Skip("no runsc wrapper (scripts/setup writes bin/sandboxd-runsc)")
	}
	t.Parallel()
	wrapper := filepath.Join(t.TempDir(), "runsc-start-fails")
	script := "#!/bin/sh\nfor a do [ \"$a\" = start ] && { echo 'start refused by the test' >&2; exit 1; }; done\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	eng := env.ContainerdWithRunsc(t, wrapper)
	cfg := env.Cfg
	cfg.AllowRunsc = true
	b, err := broker.New(eng, env.Blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t, sh("echo must-not-run"), func(j *sandbox.Job) { j.Runtime = sandbox.RuntimeRunsc })
	res := env.Run(t, b, j)
	if res.Status != sandbox.StatusError || !strings.Contains(res.Cause, "start") {
		t.Fatalf("status %s cause %q, want error at start", res.Status, res.Cause)
	}
	cs, err := eng.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", broker.LabelJob+"="+j.ID)})
	if err != nil || len(cs.Items) != 0 {
		t.Fatalf("containers of the job: %v %v", cs.Items, err)
	}
	// The container's ID is its name and 8 hex digits.
	out, _ := exec.Command("pgrep", "-f", "runsc-sandbox.* "+broker.ContainerName(env.BrokerName, j.ID, j.Digest)+`\.[0-9a-f]{8}$`).Output()
	if len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("the job's runsc sandbox process is still alive: %s", out)
	}
}

// On containerd an update is checked as a create is: containerd creates
// a task from the spec it stores, so a spec outside the security table
// (here swap beyond the memory limit) is never written.
func TestContainerdUpdateIsChecked(t *testing.T) {
	if env.Ctr == nil {
		t.Skip("a containerd engine test (SANDBOXD_ENGINE=containerd)")
	}
	t.Parallel()
	b, name := poolBroker(t, 1, time.Minute)
	if r := env.Run(t, b, newJob(t, sh("true"), nil)); r.Status != sandbox.StatusSucceeded {
		t.Fatalf("first: %s (%s)", r.Status, r.Cause)
	}
	waitReady(t, b, 1)
	cs, err := env.Eng.ContainerList(context.Background(), client.ContainerListOptions{Filters: make(client.Filters).Add("label", broker.LabelBroker+"="+name)})
	if err != nil || len(cs.Items) != 1 {
		t.Fatalf("pooled containers: %v %v", len(cs.Items), err)
	}
	mem := sandbox.DefaultLimits().MemoryBytes
	_, err = env.Eng.ContainerUpdate(context.Background(), cs.Items[0].ID, client.ContainerUpdateOptions{
		Resources: &container.Resources{Memory: mem, MemorySwap: 4 * mem},
	})
	var se *broker.SettingError
	if !errors.As(err, &se) {
		t.Fatalf("update with swap 4× memory: %v, want refused naming the setting", err)
	}
	in, err := env.Eng.ContainerInspect(context.Background(), cs.Items[0].ID, client.ContainerInspectOptions{})
	if err != nil || in.Container.HostConfig.MemorySwap != in.Container.HostConfig.Memory {
		t.Errorf("after the refused update: swap %d memory %d (%v), want them equal", in.Container.HostConfig.MemorySwap, in.Container.HostConfig.Memory, err)
	}
}

// A process killed while containerd creates its container's task leaves
// that create under way inside containerd, and containerd 1.6 can leave
// its bundle directory (and shim) behind for good. The restarted daemon
// proves the job never ran (its container never started), removes the
// container and creates it again under the same name; under the same ID,
// the new task's create met the old one's bundle: "failed to start shim:
// mkdir …: file exists", the job ended in error (CI, TestFleetSoak on
// containerd; and this test under CI's load, every cut after the first
// bundle left). Every container now gets a fresh ID. Here the cut is an
// attach cancelled after a delay, swept across the time a whole attach
// takes; each time the container is removed at once and made again under
// its name, and its task must be created. A cancelled attach no longer
// cuts the create inside containerd (the engine lets it run to its end and
// the removal waits for it), so no cut leaves a shim either; a killed
// process still can, and the reaper's sweep ends that shim
// (TestEndOrphanedShimsEndsOnlyOrphans).
func TestATaskCreateCutShortDoesNotBlockTheNext(t *testing.T) {
	if env.Ctr == nil {
		t.Skip("a containerd engine test (SANDBOXD_ENGINE=containerd)")
	}
	t.Parallel()
	ctx, cancelAll := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelAll()
	opts := jobContainerOptions(t, newJob(t, sh("exit 0"), nil))
	name := opts.Name
	remove := func() {
		if _, err := env.Eng.ContainerRemove(context.Background(), name, client.ContainerRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("remove %s: %v", name, err)
		}
	}
	t.Cleanup(remove)
	attach := func(ctx context.Context) error { return attachTo(ctx, name) }
	// The cuts fall across one whole attach, as long as it takes here.
	if _, err := env.Eng.ContainerCreate(ctx, opts); err != nil {
		t.Fatalf("create: %v", err)
	}
	began := time.Now()
	if err := attach(ctx); err != nil {
		t.Fatalf("attach: %v", err)
	}
	whole := time.Since(began)
	remove()
	var cutIDs []string
	t.Cleanup(func() {
		for _, id := range cutIDs {
			killShims(env.Ctr.Namespace(), id)
		}
	})
	for i := range 10 {
		cut := whole * time.Duration(i) / 10
		created, err := env.Eng.ContainerCreate(ctx, opts)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		cutIDs = append(cutIDs, created.ID)
		cctx, cancel := context.WithTimeout(ctx, cut)
		attach(cctx)
		cancel()
		remove()
		if _, err := env.Eng.ContainerCreate(ctx, opts); err != nil {
			t.Fatalf("create again after a create cut at %v of %v: %v", cut, whole, err)
		}
		if err := attach(ctx); err != nil {
			t.Errorf("attach after a task create cut at %v of %v: %v", cut, whole, err)
		}
		remove()
	}

	// A create is never cut short inside containerd: it runs to its end,
	// and the removal waits for it and deletes its task, so no cut leaves
	// a shim behind (before, about one cut in 50 here did).
	for deadline := time.Now().Add(5 * time.Second); len(shimsOf(env.Ctr.Namespace(), cutIDs)) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("shims of removed containers still alive: %v", shimsOf(env.Ctr.Namespace(), cutIDs))
		}
	}
}

// attachTo attaches to a container: on containerd, that creates its task.
func attachTo(ctx context.Context, name string) error {
	a, err := env.Eng.ContainerAttach(ctx, name, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err == nil {
		a.Close()
	}
	return err
}

// shimsOf returns the IDs among ids that a runc shim of the namespace
// serves (a root process running the shim binary with that namespace and
// ID).
func shimsOf(ns string, ids []string) []string {
	var out []string
	for _, id := range ids {
		if pgrepShim(ns, id) != "" {
			out = append(out, id)
		}
	}
	return out
}

func pgrepShim(ns, id string) string {
	out, _ := exec.Command("pgrep", "-u", "0", "-f", "^[^ ]*containerd-shim-runc-v2 -namespace "+ns+" -id "+strings.ReplaceAll(id, ".", `\.`)+" ").Output()
	return strings.TrimSpace(string(out))
}

// jobContainerOptions are the options the broker creates j's container
// with; the job itself is not run (its create is refused).
func jobContainerOptions(t *testing.T, j sandbox.Job) client.ContainerCreateOptions {
	t.Helper()
	cap := &capturingEngine{Engine: env.Eng}
	b, err := broker.New(cap, env.Blobs, env.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background(), j)
	if cap.opts.Name == "" {
		t.Fatalf("no job container created: %s (%s), %v", res.Status, res.Cause, err)
	}
	return cap.opts
}

// capturingEngine keeps the options of the first job container the
// broker creates and refuses to create it.
type capturingEngine struct {
	broker.Engine
	opts client.ContainerCreateOptions
}

func (c *capturingEngine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	if o.Config != nil && o.Config.Labels[broker.LabelRole] == "job" {
		c.opts = o
		return client.ContainerCreateResult{}, errors.New("not created: the test wanted its options only")
	}
	return c.Engine.ContainerCreate(ctx, o)
}

// The sweep the daemon's reaper makes on containerd ends a runc shim that
// serves no container of this engine — what a task create cut short
// leaves — and no other: not the shim of a container containerd records,
// nor one of another namespace, of another containerd, or whose ID is not
// of this engine's form. Each shim here is the real shim binary started as
// containerd starts one (its start command, in a bundle directory with a
// log FIFO), an orphan under an ID no container has. One orphan never had
// its log read (so it still waits to open it, and ignores SIGTERM); one
// names containerd's socket by another path to the same file.
//
// Not parallel: its sweep would end, and so hide, a shim another test
// must find left (TestATaskCreateCutShortDoesNotBlockTheNext).
func TestEndOrphanedShimsEndsOnlyOrphans(t *testing.T) {
	if env.Ctr == nil {
		t.Skip("a containerd engine test (SANDBOXD_ENGINE=containerd)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, addr := env.Ctr.Namespace(), env.Ctr.Address()
	sfx := fmt.Sprintf("sbtest-%x", time.Now().UnixNano()&0xffffff)
	orphan, unread, aliased := sfx+"-orphan.0123abcd", sfx+"-unread.0123abcd", sfx+"-aliased.0123abcd"
	sockets := map[string]string{}
	sockets[orphan] = startShim(t, ns, orphan, addr, true)
	sockets[unread] = startShim(t, ns, unread, addr, false)
	alias := ""
	switch {
	case strings.HasPrefix(addr, "/var/run/"):
		alias = strings.TrimPrefix(addr, "/var")
	case strings.HasPrefix(addr, "/run/"):
		alias = "/var" + addr
	}
	if alias != "" {
		sockets[aliased] = startShim(t, ns, aliased, alias, true)
	}
	otherNS, otherAddr, group := sfx+"-otherns.0123abcd", sfx+"-elsewhere.0123abcd", sfx+"-group"
	startShim(t, ns+"-test", otherNS, addr, true)
	elsewhere := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", elsewhere) // another containerd's socket, as far as a shim can tell
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	startShim(t, ns, otherAddr, elsewhere, true)
	startShim(t, ns, group, addr, true)

	live := jobContainerOptions(t, newJob(t, sh("exit 0"), nil))
	t.Cleanup(func() {
		env.Eng.ContainerRemove(context.Background(), live.Name, client.ContainerRemoveOptions{Force: true})
	})
	made, err := env.Eng.ContainerCreate(ctx, live)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := attachTo(ctx, live.Name); err != nil { // its task, and so its shim
		t.Fatalf("attach: %v", err)
	}
	if pgrepShim(ns, made.ID) == "" {
		t.Fatalf("no shim of the live container %s", made.ID)
	}
	// A shim younger than 5 s is left for a later sweep (it may be one
	// ending with its container's removal).
	if ended, err := env.Ctr.EndOrphanedShims(ctx); slices.Contains(ended, orphan) || err != nil {
		t.Errorf("a sweep at once ended %v (%v), want the young orphans left", ended, err)
	}
	time.Sleep(5 * time.Second)

	ended, err := env.Ctr.EndOrphanedShims(ctx)
	if err != nil {
		t.Errorf("end orphaned shims: %v", err)
	}
	for _, id := range []string{made.ID, otherNS, otherAddr, group} {
		if slices.Contains(ended, id) {
			t.Errorf("ended the shim of %s", id)
		}
	}
	// Ended means gone (another test's sweep may have ended one first:
	// what counts is that it is gone).
	for _, id := range []string{orphan, unread, aliased} {
		if pgrepShim(ns, id) != "" {
			t.Errorf("the orphaned shim of %s is still alive after the sweep (ended %v)", id, ended)
		}
		if sock := sockets[id]; sock != "" {
			if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the orphaned shim of %s left its socket %s: %v", id, sock, err)
			}
		}
	}
	if alias == "" {
		t.Logf("containerd's socket %s has no other name here: not tried", addr)
	}
	if pgrepShim(ns, made.ID) == "" || pgrepShim(ns+"-test", otherNS) == "" || pgrepShim(ns, otherAddr) == "" || pgrepShim(ns, group) == "" {
		t.Errorf("a shim that serves a container, or is not this engine's, is gone")
	}
	if in, err := env.Eng.ContainerInspect(ctx, made.ID, client.ContainerInspectOptions{}); err != nil || in.Container.State.Status != container.StateCreated {
		t.Errorf("the live container after the sweep: %v", err)
	}
}

// startShim starts the runc shim binary as containerd 1.6 does for a task
// create (its start command in a bundle directory holding the spec and a
// log FIFO), for a container id that need not exist, and returns the path
// of its socket. With read, the log is read, as containerd reads it, and
// the shim serves until signalled; without, the shim waits to open its
// log. It is killed, and its socket removed, when the test ends.
func startShim(t *testing.T, ns, id, address string, read bool) string {
	t.Helper()
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(bundle, "log"), 0o600); err != nil {
		t.Fatal(err)
	}
	if read {
		logf, err := os.OpenFile(filepath.Join(bundle, "log"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, logf)
		t.Cleanup(func() { logf.Close() })
	}
	var socket string
	t.Cleanup(func() {
		killShims(ns, id)
		if socket != "" {
			os.Remove(socket) // a killed shim leaves it
		}
	})
	cmd := exec.Command("containerd-shim-runc-v2", "-namespace", ns, "-id", id, "-address", address, "-publish-binary", "/usr/bin/containerd", "start")
	cmd.Dir = bundle
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start a shim: %v: %s", err, out)
	}
	socket = strings.TrimPrefix(strings.TrimSpace(string(out)), "unix://")
	if !strings.HasPrefix(socket, "/run/containerd/s/") {
		t.Fatalf("the shim's start said %q, not its socket", out)
	}
	for deadline := time.Now().Add(5 * time.Second); pgrepShim(ns, id) == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the shim of %s did not start", id)
		}
	}
	return socket
}

// killShims SIGKILLs the runc shims of id in namespace ns and waits (up to
// 5 s) until none is left.
func killShims(ns, id string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		pids := strings.Fields(pgrepShim(ns, id))
		if len(pids) == 0 {
			return
		}
		for _, f := range pids {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}
