package containerdengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/containers"
	ctrderrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux/label"
	"golang.org/x/sys/unix"
)

// Engine-owned labels on every container, beside the broker's.
const (
	labelName    = "sandboxd.ctr/name"    // the Docker-style name (asked for at create, or a rename's)
	labelImage   = "sandboxd.ctr/image"   // the image ID
	labelRuntime = "sandboxd.ctr/runtime" // the job runtime (runc, runsc)
	labelLog     = "sandboxd.ctr/log"     // the LogConfig asked for, as JSON
	labelDNS     = "sandboxd.ctr/dns"     // the resolver asked for ("" or 127.0.0.1: none is reachable)
	labelStdin   = "sandboxd.ctr/stdin"   // "open" when the container takes stdin
	labelStarted = "sandboxd.ctr/started" // start time, RFC 3339
	labelLease   = "sandboxd.ctr/container"
)

// runcShim is the runtime every container uses; runsc runs as its binary.
const runcShim = "io.containerd.runc.v2"

// CheckContainerName refuses a name containerd cannot give a container:
// over 76 characters, or with a separator doubled, leading or trailing.
func (e *Engine) CheckContainerName(name string) error {
	if err := identifiers.Validate(name); err != nil {
		return fmt.Errorf("container name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ContainerCreate creates a container under a fresh ID (newID) and the
// name asked for, reserved so that a second create (or a rename onto it)
// conflicts; its root is the image's shared read-only view; its spec is
// translated from the options.
func (e *Engine) ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	ctx = e.ns(ctx)
	name := strings.TrimPrefix(opts.Name, "/")
	if err := e.CheckContainerName(name); err != nil {
		return client.ContainerCreateResult{}, err
	}
	if opts.Config == nil || opts.HostConfig == nil {
		return client.ContainerCreateResult{}, fmt.Errorf("create %s: no config: %w", name, errdefs.ErrInvalidArgument)
	}
	img, err := e.imports.ensure(ctx, opts.Config.Image)
	if err != nil {
		return client.ContainerCreateResult{}, err
	}
	id := newID(name)
	spec, err := e.specFor(opts, img, id)
	if err != nil {
		return client.ContainerCreateResult{}, err
	}
	view, err := e.imports.rootfsFor(ctx, img, mountTargets(spec), resolverOf(opts.HostConfig))
	if err != nil {
		return client.ContainerCreateResult{}, err
	}
	// From its volumes' check to its record in containerd, no process
	// removes a volume it mounts (VolumeRemove looks for users under the
	// same lock, exclusive), as Docker keeps a reference per container.
	unlock, err := e.lockVolumes(unix.LOCK_SH)
	if err != nil {
		return client.ContainerCreateResult{}, err
	}
	defer unlock()
	for _, m := range opts.HostConfig.Mounts {
		// A named volume that does not exist is created, empty and
		// unlabelled, as Docker does.
		if _, err := e.readVolume(m.Source); errdefs.IsNotFound(err) {
			if _, err := e.VolumeCreate(ctx, client.VolumeCreateOptions{Name: m.Source}); err != nil {
				return client.ContainerCreateResult{}, err
			}
		}
	}
	rt := opts.HostConfig.Runtime
	if rt == "" {
		rt = "runc"
	}
	logCfg, _ := json.Marshal(opts.HostConfig.LogConfig)
	labels := map[string]string{}
	for k, v := range opts.Config.Labels {
		labels[k] = v
	}
	labels[labelName] = name
	labels[labelImage] = img.id
	labels[labelRuntime] = rt
	labels[labelLog] = string(logCfg)
	if r := resolverOf(opts.HostConfig); r != "" {
		labels[labelDNS] = r
	}
	if opts.Config.OpenStdin {
		labels[labelStdin] = "open"
	}
	e.naming.Lock()
	if e.creating == nil {
		e.creating = map[string]bool{}
	}
	e.creating[name] = true
	err = e.reserveName(ctx, name, id)
	e.naming.Unlock()
	defer func() {
		e.naming.Lock()
		delete(e.creating, name)
		e.naming.Unlock()
	}()
	if err != nil {
		return client.ContainerCreateResult{}, err
	}
	ropts := &options.Options{}
	if bin := e.runtimes[rt]; bin != "runc" {
		ropts.BinaryName = bin
	}
	// On a failure below, only what this create made goes: its name's
	// lease and its stdio directory (makeIO makes a new one or fails),
	// never anything of another container of the same ID.
	if err := e.makeIO(id); err != nil {
		e.releaseName(ctx, name)
		return client.ContainerCreateResult{}, err
	}
	// What the spec is made from stays with the engine: every task and
	// update is checked against the spec made again from it.
	if err := e.keepInputs(id, createInputs{Config: opts.Config, HostConfig: opts.HostConfig, ImageEnv: img.env}); err != nil {
		e.releaseName(ctx, name)
		os.RemoveAll(e.ioDir(id))
		return client.ContainerCreateResult{}, err
	}
	// Under the name's lease, the client makes no lease of its own (two
	// round trips); nothing this create makes is held by a lease.
	_, err = e.c.NewContainer(leases.WithLease(ctx, name), id,
		containerd.WithSpec(spec),
		containerd.WithContainerLabels(labels),
		containerd.WithImageName(imageName(img.id)),
		containerd.WithSnapshotter(e.cfg.Snapshotter),
		containerd.WithSnapshot(view),
		containerd.WithRuntime(runcShim, ropts),
	)
	if err != nil {
		e.releaseName(ctx, name)
		os.RemoveAll(e.ioDir(id))
		return client.ContainerCreateResult{}, err
	}
	return client.ContainerCreateResult{ID: id}, nil
}

// newID is a fresh container ID for a container of the given name: the
// name (cut to fit containerd's 76 characters) and 8 random hex digits.
// An ID is never used twice: a process killed while containerd created a
// container's task leaves that create under way, and containerd 1.6 can
// leave its bundle directory (and the shim it started) behind for good;
// every later task of that ID would fail on it ("failed to start shim:
// mkdir …: file exists": CI, TestFleetSoak, a job its restarted daemon
// proved never ran, made again under its name). The broker's names end
// in "-" and hex digits, an ID in "." and hex digits: no name the broker
// gives is another container's ID (load tries a reference as an ID
// first).
func newID(name string) string {
	var b [4]byte
	rand.Read(b[:])
	suffix := "." + hex.EncodeToString(b[:])
	if max := maxID - len(suffix); len(name) > max {
		name = strings.TrimRight(name[:max], "._-")
	}
	return name + suffix
}

// maxID is the longest identifier containerd takes.
const maxID = 76

// mountTargets are the destinations of a spec's mounts: the mount points
// its root view holds.
func mountTargets(s *specs.Spec) []string {
	var targets []string
	for _, m := range s.Mounts {
		targets = append(targets, m.Destination)
	}
	return targets
}

// resolverOf is the one resolver address asked for, or "".
func resolverOf(hc *container.HostConfig) string {
	if len(hc.DNS) == 1 {
		return hc.DNS[0].String()
	}
	return ""
}

// reserveName takes a container name for id: a lease of that ID exists
// exactly while the name is taken.
func (e *Engine) reserveName(ctx context.Context, name, id string) error {
	_, err := e.c.LeasesService().Create(ctx, leases.WithID(name), leases.WithLabels(map[string]string{labelLease: id}))
	if errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("container name %s is taken: %w", name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("reserve container name %s: %w", name, err)
	}
	return nil
}

// releaseUnrecorded frees name if a create took it for a container it
// never recorded (a create of this process under way keeps it): the
// name's lease, whose container does not exist, and that container's
// stdio directory.
func (e *Engine) releaseUnrecorded(ctx context.Context, name string) error {
	e.naming.Lock()
	defer e.naming.Unlock()
	if e.creating[name] || identifiers.Validate(name) != nil {
		return nil
	}
	ls := e.c.LeasesService()
	held, err := ls.List(ctx, "id=="+strconv.Quote(name))
	if err != nil {
		return err
	}
	for _, l := range held {
		id := l.Labels[labelLease]
		if l.ID != name || identifiers.Validate(id) != nil {
			continue // not a name this engine took
		}
		if _, err := e.c.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
			return err // recorded (nil: the name is its), or no answer
		}
		if err := ls.Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		os.RemoveAll(e.ioDir(id))
	}
	return nil
}

// releaseName frees a name this process just took (its lease).
func (e *Engine) releaseName(ctx context.Context, name string) {
	e.c.LeasesService().Delete(ctx, leases.Lease{ID: name})
}

// releaseNames frees every name held for id: the leases labelled with
// it, found by containerd's filter (one answer, whatever the number of
// containers alive).
func (e *Engine) releaseNames(ctx context.Context, id string) error {
	ls := e.c.LeasesService()
	held, err := ls.List(ctx, "labels."+strconv.Quote(labelLease)+"=="+strconv.Quote(id))
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range held {
		if l.Labels[labelLease] != id {
			continue // never another container's
		}
		if err := ls.Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// load finds a container by ID or by a name it holds.
func (e *Engine) load(ctx context.Context, ref string) (containerd.Container, error) {
	ref = strings.TrimPrefix(ref, "/")
	if identifiers.Validate(ref) != nil {
		return nil, fmt.Errorf("container %q: %w", ref, errdefs.ErrNotFound)
	}
	c, err := e.c.LoadContainer(ctx, ref)
	if err == nil {
		return c, nil
	}
	if !errdefs.IsNotFound(err) {
		return nil, err
	}
	named, lerr := e.c.LeasesService().List(ctx, "id=="+strconv.Quote(ref))
	if lerr != nil {
		return nil, lerr
	}
	for _, l := range named {
		if l.ID == ref && l.Labels[labelLease] != "" {
			return e.c.LoadContainer(ctx, l.Labels[labelLease])
		}
	}
	return nil, fmt.Errorf("container %s: %w", ref, err)
}

// infoOf is the record load read: no second round trip.
func infoOf(ctx context.Context, c containerd.Container) (containers.Container, error) {
	return c.Info(ctx, containerd.WithoutRefreshedMetadata)
}

// specOf decodes the OCI spec of a container's record.
func specOf(info containers.Container) (*specs.Spec, error) {
	if info.Spec == nil {
		return nil, fmt.Errorf("container %s has no spec", info.ID)
	}
	var s specs.Spec
	if err := json.Unmarshal(info.Spec.GetValue(), &s); err != nil {
		return nil, fmt.Errorf("container %s: spec: %w", info.ID, err)
	}
	return &s, nil
}

// taskStatus reads the state of a container's task in one round trip
// (NotFound if it has none), with its init process's pid.
func (e *Engine) taskStatus(ctx context.Context, id string) (containerd.Status, uint32, error) {
	r, err := e.c.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
	if err != nil {
		return containerd.Status{}, 0, ctrderrdefs.FromGRPC(err)
	}
	if r.Process == nil {
		return containerd.Status{}, 0, fmt.Errorf("task %s: no process: %w", id, errdefs.ErrNotFound)
	}
	st := containerd.Status{
		Status:     containerd.ProcessStatus(strings.ToLower(r.Process.Status.String())),
		ExitStatus: r.Process.ExitStatus,
	}
	if r.Process.ExitedAt != nil {
		st.ExitTime = r.Process.ExitedAt.AsTime()
	}
	return st, r.Process.Pid, nil
}

// ContainerRename moves a container to a new name; a name that is taken
// is a conflict.
func (e *Engine) ContainerRename(ctx context.Context, id string, opts client.ContainerRenameOptions) (client.ContainerRenameResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerRenameResult{}, err
	}
	name := strings.TrimPrefix(opts.NewName, "/")
	if err := identifiers.Validate(name); err != nil {
		return client.ContainerRenameResult{}, fmt.Errorf("container name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	if err := e.reserveName(ctx, name, c.ID()); err != nil {
		return client.ContainerRenameResult{}, err
	}
	info, err := infoOf(ctx, c)
	if err != nil {
		return client.ContainerRenameResult{}, err
	}
	old := info.Labels[labelName]
	if _, err := c.SetLabels(ctx, map[string]string{labelName: name}); err != nil {
		return client.ContainerRenameResult{}, err
	}
	if old != "" && old != name {
		e.c.LeasesService().Delete(ctx, leases.Lease{ID: old})
	}
	return client.ContainerRenameResult{}, nil
}

// ContainerStart starts the container's task, creating it (without stdin)
// if nothing attached. The spec is read back and checked against the
// security table first: a container that would run weaker never starts.
func (e *Engine) ContainerStart(ctx context.Context, id string, _ client.ContainerStartOptions) (client.ContainerStartResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerStartResult{}, err
	}
	st, _, err := e.taskStatus(ctx, c.ID())
	if errdefs.IsNotFound(err) {
		var info containers.Container
		if info, err = infoOf(ctx, c); err == nil {
			err = e.newTask(ctx, info, false)
		}
		st.Status = containerd.Created
	}
	if err != nil {
		return client.ContainerStartResult{}, err
	}
	if st.Status != containerd.Created {
		return client.ContainerStartResult{}, fmt.Errorf("container %s is %s: %w", c.ID(), st.Status, errdefs.ErrConflict)
	}
	if _, err := c.SetLabels(ctx, map[string]string{labelStarted: time.Now().UTC().Format(time.RFC3339Nano)}); err != nil {
		return client.ContainerStartResult{}, err
	}
	if _, err := e.c.TaskService().Start(ctx, &tasks.StartRequest{ContainerID: c.ID()}); err != nil {
		// A failed start leaves nothing running: the task goes, the
		// container stays for the caller to remove.
		e.deleteTask(context.WithoutCancel(ctx), c, "")
		return client.ContainerStartResult{}, fmt.Errorf("start %s: %w", c.ID(), ctrderrdefs.FromGRPC(err))
	}
	return client.ContainerStartResult{}, nil
}

// newTask checks the container's record (checkRecord: its spec, as the
// record holds it, row by row and against the spec made again from its
// kept create options) and creates its task (the runtime's create:
// namespaces, mounts, seccomp) with that record's root filesystem and its
// stdio on the engine's files. containerd takes the spec from its own
// store: every spec this engine writes there (create, update) has passed
// the same check.
func (e *Engine) newTask(ctx context.Context, info containers.Container, stdin bool) error {
	spec, _, err := e.checkRecord(info)
	if err != nil {
		return fmt.Errorf("container %s: %w", info.ID, err)
	}
	if info.Snapshotter == "" || info.SnapshotKey == "" {
		return fmt.Errorf("container %s has no root filesystem snapshot: %w", info.ID, errdefs.ErrInvalidArgument)
	}
	mounts, err := e.c.SnapshotService(info.Snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return fmt.Errorf("container %s: root filesystem: %w", info.ID, err)
	}
	dir := e.ioDir(info.ID)
	req := &tasks.CreateTaskRequest{ContainerID: info.ID, Stdout: filepath.Join(dir, "stdout"), Stderr: filepath.Join(dir, "stderr")}
	if stdin {
		req.Stdin = filepath.Join(dir, "stdin")
	}
	for _, m := range mounts {
		// As containerd's client adds it (an SELinux host's mount label).
		if spec.Linux != nil && spec.Linux.MountLabel != "" {
			if l := label.FormatMountLabel("", spec.Linux.MountLabel); l != "" {
				m.Options = append(m.Options, l)
			}
		}
		req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	err = e.createTask(ctx, info.ID, func(ctx context.Context) error {
		_, err := e.c.TaskService().Create(ctx, req)
		return ctrderrdefs.FromGRPC(err)
	})
	if errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("container %s already has a task: %w", info.ID, errdefs.ErrConflict)
	}
	return err
}

// taskCreateTimeout bounds a task create that its caller stopped waiting
// for.
const taskCreateTimeout = 2 * time.Minute

// createTask asks containerd to create container id's task (create) and
// lets that create run to its end even if ctx ends first (the caller is
// told ctx's error at once). containerd 1.6 does not undo a create cut short while its shim
// starts: that shim is left running with no task containerd can delete
// (EndOrphanedShims). A removal of the container waits for the create
// (beginRemoval), so the task it made is deleted with the container; a
// create asked for while the container is being removed is refused.
func (e *Engine) createTask(ctx context.Context, id string, create func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create the task of %s: %w", id, err)
	}
	done := make(chan struct{})
	for {
		e.taskMu.Lock()
		if e.removingTasks[id] > 0 {
			e.taskMu.Unlock()
			return fmt.Errorf("container %s is being removed: %w", id, errdefs.ErrNotFound)
		}
		earlier := e.makingTasks[id]
		if earlier == nil {
			if e.makingTasks == nil {
				e.makingTasks = map[string]chan struct{}{}
			}
			e.makingTasks[id] = done
			e.taskMu.Unlock()
			break
		}
		e.taskMu.Unlock()
		select {
		case <-earlier:
		case <-ctx.Done():
			return fmt.Errorf("container %s: a task create under way: %w", id, ctx.Err())
		}
	}
	result := make(chan error, 1)
	go func() {
		defer func() {
			e.taskMu.Lock()
			delete(e.makingTasks, id)
			e.taskMu.Unlock()
			close(done)
		}()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), taskCreateTimeout)
		defer cancel()
		result <- create(cctx)
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return fmt.Errorf("create the task of %s: %w", id, ctx.Err())
	}
}

// beginRemoval waits until no task create of container id is under way
// in this process (or ctx ends), and refuses every create of it until
// the returned end is called: a create that began after the wait would
// make a task (and a shim) for a record about to go.
func (e *Engine) beginRemoval(ctx context.Context, id string) (end func(), err error) {
	for {
		e.taskMu.Lock()
		making := e.makingTasks[id]
		if making == nil {
			if e.removingTasks == nil {
				e.removingTasks = map[string]int{}
			}
			e.removingTasks[id]++
			e.taskMu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					e.taskMu.Lock()
					if e.removingTasks[id]--; e.removingTasks[id] <= 0 {
						delete(e.removingTasks, id)
					}
					e.taskMu.Unlock()
				})
			}, nil
		}
		e.taskMu.Unlock()
		select {
		case <-making:
		case <-ctx.Done():
			return nil, fmt.Errorf("container %s: a task create under way: %w", id, ctx.Err())
		}
	}
}

// tasksInFlight waits up to d for this process's task creates to end.
func (e *Engine) tasksInFlight(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		e.taskMu.Lock()
		n := len(e.makingTasks)
		e.taskMu.Unlock()
		if n == 0 {
			return
		}
	}
}

// deleteTask kills and deletes a container's task, whatever its state
// (st, if the caller just read it; "" to read it). A task runsc failed to
// start stays CREATED and cannot be deleted while its sandbox process
// lives: that process (the task's pid, checked to be this container's) is
// killed, then the task is deleted.
func (e *Engine) deleteTask(ctx context.Context, c containerd.Container, st containerd.ProcessStatus) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id := c.ID()
	if st == "" {
		s, _, err := e.taskStatus(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil
		}
		st = s.Status
	}
	if st != "" && st != containerd.Stopped {
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			e.c.TaskService().Wait(ctx, &tasks.WaitRequest{ContainerID: id}) // ends with ctx at the latest
		}()
		if _, err := e.c.TaskService().Kill(ctx, &tasks.KillRequest{ContainerID: id, Signal: uint32(syscall.SIGKILL)}); err == nil {
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
			}
		}
	}
	_, err := e.c.TaskService().Delete(ctx, &tasks.DeleteTaskRequest{ContainerID: id})
	err = ctrderrdefs.FromGRPC(err)
	if err == nil || errdefs.IsNotFound(err) {
		return nil
	}
	t, terr := c.Task(ctx, nil)
	if errdefs.IsNotFound(terr) {
		return nil
	}
	if terr != nil {
		return err
	}
	if st, serr := t.Status(ctx); serr == nil && st.Status == containerd.Created {
		killSandboxProcess(int(t.Pid()), t.ID())
	}
	_, err = t.Delete(ctx, containerd.WithProcessKill)
	if err == nil || errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// killSandboxProcess kills a task's own process if it is still the one
// of that container (its command line names the container), through a
// pidfd opened before the check (never a reused pid), and waits up to 2 s
// for it to end.
func killSandboxProcess(pid int, id string) {
	if pid <= 1 {
		return
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), id) {
		return
	}
	if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
		exited(fd, 2*time.Second)
	}
}

// ContainerKill signals the container's init process.
func (e *Engine) ContainerKill(ctx context.Context, id string, opts client.ContainerKillOptions) (client.ContainerKillResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerKillResult{}, err
	}
	t, err := c.Task(ctx, nil)
	if err != nil {
		return client.ContainerKillResult{}, err
	}
	sig := syscall.SIGKILL
	switch opts.Signal {
	case "", "SIGKILL", "KILL", "9":
	case "SIGTERM", "TERM", "15":
		sig = syscall.SIGTERM
	default:
		return client.ContainerKillResult{}, fmt.Errorf("signal %q: %w", opts.Signal, errdefs.ErrInvalidArgument)
	}
	if st, err := t.Status(ctx); err == nil && st.Status == containerd.Stopped {
		return client.ContainerKillResult{}, fmt.Errorf("container %s is not running: %w", c.ID(), errdefs.ErrConflict)
	}
	exited, err := t.Wait(ctx)
	if err != nil {
		return client.ContainerKillResult{}, err
	}
	if err := t.Kill(ctx, sig); err != nil {
		return client.ContainerKillResult{}, err
	}
	if sig == syscall.SIGKILL {
		// As Docker's kill does: it returns once the container stopped
		// (or after a bound), so that no one takes it for running.
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
		}
	}
	return client.ContainerKillResult{}, nil
}

// ContainerWait waits for the task to exit. A container that never
// started is not running: the wait ends at once, except for next-exit,
// which waits for a task to appear and exit.
func (e *Engine) ContainerWait(ctx context.Context, id string, opts client.ContainerWaitOptions) client.ContainerWaitResult {
	ctx = e.ns(ctx)
	res := make(chan container.WaitResponse, 1)
	errc := make(chan error, 1)
	go func() {
		c, err := e.load(ctx, id)
		if err != nil {
			errc <- err
			return
		}
		if info, err := infoOf(ctx, c); err == nil {
			e.endOrphanedStdin(ctx, c.ID(), info.Labels)
		}
		for {
			r, err := e.c.TaskService().Wait(ctx, &tasks.WaitRequest{ContainerID: c.ID()})
			err = ctrderrdefs.FromGRPC(err)
			switch {
			case errdefs.IsNotFound(err) && opts.Condition != container.WaitConditionNextExit:
				res <- container.WaitResponse{}
				return
			case errdefs.IsNotFound(err):
				select {
				case <-ctx.Done():
					errc <- ctx.Err()
					return
				case <-time.After(20 * time.Millisecond):
				}
				continue
			case ctx.Err() != nil:
				errc <- ctx.Err()
			case err != nil:
				// As containerd's client reports a failed wait.
				res <- container.WaitResponse{StatusCode: int64(containerd.UnknownExitStatus)}
			default:
				res <- container.WaitResponse{StatusCode: int64(r.ExitStatus)}
			}
			return
		}
	}()
	return client.ContainerWaitResult{Result: res, Error: errc}
}

// ContainerRemove kills and deletes the task, then the container, its
// names and its stdio files. The shared root view stays.
func (e *Engine) ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if errdefs.IsNotFound(err) {
		// No container; its name may still be taken by a create that
		// stopped between taking it and recording the container (its
		// process killed): that name is freed, and the container is not
		// found, as it is not.
		if rerr := e.releaseUnrecorded(ctx, strings.TrimPrefix(id, "/")); rerr != nil {
			return client.ContainerRemoveResult{}, fmt.Errorf("remove %s: %w", id, rerr)
		}
	}
	if err != nil {
		return client.ContainerRemoveResult{}, err
	}
	// A task this process is still creating is deleted once it exists,
	// and none is begun meanwhile: the record gone, that task's shim would
	// be left to no one.
	end, err := e.beginRemoval(ctx, c.ID())
	if err != nil {
		return client.ContainerRemoveResult{}, fmt.Errorf("remove %s: %w", c.ID(), err)
	}
	defer end()
	st, _, err := e.taskStatus(ctx, c.ID())
	switch {
	case err == nil:
		if st.Status == containerd.Running && !opts.Force {
			return client.ContainerRemoveResult{}, fmt.Errorf("container %s is running: %w", c.ID(), errdefs.ErrConflict)
		}
		if err := e.deleteTask(ctx, c, st.Status); err != nil {
			return client.ContainerRemoveResult{}, fmt.Errorf("remove %s: task: %w", c.ID(), err)
		}
	case !errdefs.IsNotFound(err):
		return client.ContainerRemoveResult{}, err
	}
	// The task is gone (a new one needs this container's record, which
	// only this engine gives it).
	if err := e.c.ContainerService().Delete(ctx, c.ID()); err != nil && !errdefs.IsNotFound(err) {
		return client.ContainerRemoveResult{}, fmt.Errorf("remove %s: %w", c.ID(), err)
	}
	err = e.releaseNames(ctx, c.ID())
	os.RemoveAll(e.ioDir(c.ID()))
	return client.ContainerRemoveResult{}, err
}

// ContainerList lists the namespace's containers whose labels match the
// filters' "label" terms.
func (e *Engine) ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error) {
	ctx = e.ns(ctx)
	cs, err := e.c.Containers(ctx)
	if err != nil {
		return client.ContainerListResult{}, err
	}
	want := labelTerms(opts.Filters)
	var out client.ContainerListResult
	for _, c := range cs {
		info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
		if err != nil || !matchLabels(info.Labels, want) {
			continue
		}
		state, err := e.state(ctx, info)
		if err != nil {
			// Listed all the same: one task that cannot be read must not
			// hide the others. Inspecting it fails.
			state = &container.State{Status: "unknown"}
		}
		if !opts.All && !state.Running {
			continue
		}
		out.Items = append(out.Items, container.Summary{
			ID: info.ID, Names: []string{"/" + info.Labels[labelName]}, Image: info.Labels[labelImage], ImageID: info.Labels[labelImage],
			Labels: userLabels(info.Labels), State: state.Status, Created: info.CreatedAt.Unix(),
		})
	}
	slices.SortFunc(out.Items, func(a, b container.Summary) int { return int(b.Created - a.Created) })
	return out, nil
}

// userLabels are a container's labels without the engine's own.
func userLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if !strings.HasPrefix(k, "sandboxd.ctr/") {
			out[k] = v
		}
	}
	return out
}

// state is the container's state as Docker reports it, from its record
// and one read of its task (stateOf). A task that cannot be read is an
// error, never a state: recovery reads "created" as "never started".
func (e *Engine) state(ctx context.Context, info containers.Container) (*container.State, error) {
	st, pid, err := e.taskStatus(ctx, info.ID)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("container %s: read its task: %w", info.ID, err)
	}
	s := stateOf(info.Labels[labelStarted], st, pid, err == nil)
	if s.Status == container.StateExited {
		s.OOMKilled = oomKilled(info)
	}
	return s, nil
}

// stateOf is the state of a container whose start label is started ("":
// never asked to start) and whose task, if it has one, is st. Recovery
// reads "created" with no start time as "never started" (the job
// provably never ran), so:
//   - a task that is created never started, whatever the label (it is
//     set just before the start is asked, by a process that may have
//     been killed before it asked). A task still reading "created" while
//     a start of a killed process goes on may have its helper running,
//     but no job does: the broker sends the job's config only once the
//     start has returned, and recovery ends the stdin a killed attacher
//     held (endOrphanedStdin), so that helper has nothing to run;
//   - no task and no label: created, never started;
//   - no task after a start was asked (the task deleted after a failed
//     start, or lost with containerd's state): dead, for how it ended is
//     not known.
func stateOf(started string, st containerd.Status, pid uint32, hasTask bool) *container.State {
	const never = "0001-01-01T00:00:00Z"
	s := &container.State{Status: container.StateCreated, StartedAt: never, FinishedAt: never}
	if !hasTask {
		if started != "" {
			s.Status, s.StartedAt = container.StateDead, started
		}
		return s
	}
	s.Pid = int(pid)
	switch st.Status {
	case containerd.Created:
		return s
	case containerd.Running, containerd.Paused, containerd.Pausing:
		s.Status, s.Running = container.StateRunning, true
	case containerd.Stopped:
		s.Status = container.StateExited
		s.ExitCode = int(st.ExitStatus)
		s.FinishedAt = st.ExitTime.UTC().Format(time.RFC3339Nano)
		s.Pid = 0
	default:
		s.Status = container.StateDead
	}
	if started != "" {
		s.StartedAt = started
	}
	return s
}

// oomKilled reads the task's memory cgroup (it stays until the task is
// deleted): did the kernel's OOM killer act in it?
func oomKilled(info containers.Container) bool {
	spec, err := specOf(info)
	if err != nil || spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return false
	}
	p := filepath.Clean("/" + spec.Linux.CgroupsPath)
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", p, "memory.oom_control"), // v1
		filepath.Join("/sys/fs/cgroup", p, "memory.events"),             // v2
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				return strings.TrimSpace(v) != "0"
			}
		}
	}
	return false
}
