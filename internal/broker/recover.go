package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/sandbox"
)

// JobContainer is a container the broker created for a job, as found by
// its labels.
type JobContainer struct {
	ID        string
	Name      string
	JobID     string
	JobDigest string
	Deadline  time.Time
	State     string // created, running, exited, …
	Created   time.Time
}

// ListJobContainers returns every container labelled as a job of this
// broker.
func (b *Broker) ListJobContainers(ctx context.Context) ([]JobContainer, error) {
	f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+roleJob)
	cs, err := b.eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list job containers: %w", err)
	}
	out := make([]JobContainer, 0, len(cs.Items))
	for _, c := range cs.Items {
		jc := JobContainer{ID: c.ID, JobID: c.Labels[LabelJob], JobDigest: c.Labels[LabelJobDigest], State: string(c.State), Created: time.Unix(c.Created, 0)}
		if len(c.Names) > 0 {
			jc.Name = c.Names[0]
		}
		if ms, err := strconv.ParseInt(c.Labels[LabelDeadline], 10, 64); err == nil {
			jc.Deadline = time.UnixMilli(ms)
		}
		out = append(out, jc)
	}
	return out, nil
}

// RemoveJobContainer force-removes a job's container.
func (b *Broker) RemoveJobContainer(id string) { b.removeContainer(id) }

// RemoveUnboundContainer force-removes whatever container bears the job's
// container name (none is no error). The caller knows that nothing of the
// job ran in it: the job was dispatched and no container was bound to it,
// and the broker starts a container, or sends a pooled sandbox its config,
// only after the binding (Hooks.OnCreated) is made durable. A pooled
// sandbox renamed to the job's name carries no job labels, so only the
// name finds it; removing it frees the name for the job's first run.
// removed says whether there was one.
func (b *Broker) RemoveUnboundContainer(job sandbox.Job) (removed bool, err error) {
	return b.removeFound(ContainerName(b.cfg.Name, job.ID, job.Digest))
}

// Recover finishes a job whose broker stopped while its container existed.
// It never starts anything: a running container is waited for (its
// deadline, from the label, still holds), then the helper's stream is read
// back from the container's log. A job whose container never started, or
// whose stream ends before the helper said the command starts, provably
// never ran: its container is removed and the error wraps ErrNotRun, for
// the caller to run it for the first time. If the container is gone or its
// stream is not whole, the job ends uncertain — it is never run again.
// The container is removed in every case.
func (b *Broker) Recover(ctx context.Context, job sandbox.Job, containerID string) (sandbox.Result, error) {
	return b.RecoverWithHooks(ctx, job, Binding{ContainerID: containerID}, Hooks{})
}

// neverStarted says the engine reports a container that was never
// started: created, and with no start time (Docker's zero time for one
// never started; the containerd engine's start label).
func neverStarted(s *container.State) bool {
	if s == nil || s.Status != container.StateCreated {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, s.StartedAt)
	return s.StartedAt == "" || (err == nil && t.IsZero())
}

// ofJob says a container's labels are those the broker gives a container
// it creates for job j.
func ofJob(labels map[string]string, j *sandbox.Job) bool {
	return labels[LabelJob] == j.ID && labels[LabelJobDigest] == j.Digest
}

// ofEarlierPool says a container's labels are those of a sandbox this
// broker kept ready in an earlier process: never one this process keeps.
func (b *Broker) ofEarlierPool(labels map[string]string) bool {
	return labels[LabelRole] == rolePool && labels[LabelBroker] == b.cfg.Name && (b.pool == nil || labels[LabelPool] != b.pool.gen)
}

// Binding is what the caller made durable of a job's container through
// Hooks: its id (OnCreated) and when the job started in it (OnStarted).
type Binding struct {
	ContainerID string
	// StartedAt is the job's start as journaled, or zero if it was not.
	// A pooled container's hard deadline counts from it: the engine knows
	// only when the sandbox started, not when the job took it.
	StartedAt time.Time
}

// ErrNotRun marks a recovered job that provably never ran: its container
// never started, or the helper's stream (its log, which only the helper
// writes) ends before the frame it writes just before the command starts.
// The container is removed before it is returned, so the job's container
// name is free for its first run.
var ErrNotRun = errors.New("the job never ran")

// errTransient marks an engine failure during recovery: the job is not
// judged, its container is kept, and the next attempt recovers it.
var errTransient = errors.New("engine unavailable")

// RecoverWithHooks is Recover with Hooks.OnFinished called while the
// container still exists: if it fails, the container is kept so that the
// next start can recover the job again. An engine failure (not a missing
// container) is returned as an error and also keeps the container.
func (b *Broker) RecoverWithHooks(ctx context.Context, job sandbox.Job, bind Binding, hooks Hooks) (res sandbox.Result, err error) {
	containerID := bind.ContainerID
	defer b.blobs.Hold(inputDigests(&job)...)()
	if err := job.VerifyDigest(); err != nil {
		return sandbox.Result{}, err
	}
	facts, err := b.Facts(ctx)
	if err != nil {
		return sandbox.Result{}, err
	}
	r := &run{b: b, job: &job, log: b.log.With("job_id", job.ID, "container_id", containerID), containerID: containerID}
	r.res = sandbox.Result{
		Schema: sandbox.ResultSchema, JobID: job.ID, JobDigest: job.Digest, Runtime: facts,
		LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{},
	}
	r.res.Runtime.Runtime = job.Runtime
	keep := false
	defer func() {
		if p := recover(); p != nil {
			r.fail(sandbox.StatusUncertain, fmt.Sprintf("broker panic during recovery: %v", p))
			res, err = r.res, nil
		}
		if r.containerID != "" && !keep {
			b.removeContainer(r.containerID)
		}
		if r.res.EndedAt.IsZero() {
			r.res.EndedAt = time.Now().UTC()
		}
		if r.res.StartedAt.IsZero() {
			r.res.StartedAt = r.res.EndedAt
		}
	}()
	if err := r.recover(ctx, bind); err != nil {
		if errors.Is(err, ErrNotRun) && ctx.Err() == nil {
			// Its name must be free before the job runs: kept if not.
			if rerr := b.removeContainer(r.containerID); rerr != nil {
				keep = true
				return sandbox.Result{}, fmt.Errorf("recover job %s: %v; its container could not be removed: %w: %w", job.ID, err, errTransient, rerr)
			}
			r.containerID = ""
			return sandbox.Result{}, fmt.Errorf("recover job %s: %w", job.ID, err)
		}
		if ctx.Err() != nil || errors.Is(err, errTransient) {
			keep = true
			return sandbox.Result{}, fmt.Errorf("recover job %s: %w", job.ID, err)
		}
		r.fail(sandbox.StatusUncertain, err.Error())
	}
	if r.res.EndedAt.IsZero() {
		r.res.EndedAt = time.Now().UTC()
	}
	if r.res.StartedAt.IsZero() {
		r.res.StartedAt = r.res.EndedAt
	}
	r.bound()
	if hooks.OnFinished != nil {
		if err := hooks.OnFinished(ctx, r.res); err != nil {
			keep = true
			return r.res, fmt.Errorf("record result: %w", err)
		}
	}
	return r.res, nil
}

func (r *run) recover(ctx context.Context, bind Binding) error {
	b, j := r.b, r.job
	cctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	insp, err := b.eng.ContainerInspect(cctx, r.containerID, client.ContainerInspectOptions{})
	cancel()
	if isNotFound(err) {
		r.containerID = ""
		return errors.New("the job's container is gone; what happened cannot be proven")
	}
	if err != nil {
		return fmt.Errorf("inspect: %w: %w", errTransient, err)
	}
	c := insp.Container
	if c.Config == nil || c.State == nil {
		r.containerID = "" // not ours to remove
		return fmt.Errorf("container %s has no config or state", insp.Container.ID)
	}
	// The image's trees as the container mounts them: what the broker
	// decided when it created it, whatever its settings or the image's
	// presence now (a tree's volume is named for the job's image and its
	// mount point, which the plan's check then compares).
	var trees []string
	if c.HostConfig != nil {
		for _, m := range c.HostConfig.Mounts {
			if m.Type == mount.TypeVolume && m.Source == b.treeVolumeName(j.Image, m.Target) {
				trees = append(trees, m.Target)
			}
		}
	}
	spec := b.containerSpec(b.planFor(j, c.Config.Labels, trees))
	labels := c.Config.Labels
	// A pooled container carries no job's labels: the caller's journal
	// binds it to the job, and the engine's name does (the job's container
	// name, taken when the job took it). It must be this broker's, and not
	// a sandbox this process keeps ready. Its settings are checked below
	// like any other's.
	pooled := b.ofEarlierPool(labels) && poolable(j) && strings.TrimPrefix(c.Name, "/") == spec.Name
	if !pooled && !ofJob(labels, j) {
		r.containerID = "" // not ours to remove
		return fmt.Errorf("container %s does not carry this job's labels", insp.Container.ID)
	}
	// The settings were checked before start; check them again so that the
	// result reports what the container really had.
	sec, err := b.checkInspected(spec, c)
	if err != nil {
		return err
	}
	r.res.Security = sec
	r.nonce = c.Config.Labels[LabelStream]
	if neverStarted(c.State) {
		return fmt.Errorf("the broker stopped before the container started: %w", ErrNotRun)
	}
	if t, err := time.Parse(time.RFC3339Nano, c.State.StartedAt); err == nil {
		r.res.StartedAt = t.UTC()
	}
	if pooled && !bind.StartedAt.IsZero() {
		r.res.StartedAt = bind.StartedAt.UTC()
	}
	if c.State.Running {
		deadline := time.Now()
		if ms, err := strconv.ParseInt(labels[LabelDeadline], 10, 64); err == nil && !pooled {
			deadline = time.UnixMilli(ms)
		}
		if pooled {
			// The engine does not know when the job took the sandbox.
			// Without a journaled start, the job may not have had its
			// config yet, or may have run for any time: it is killed
			// now, and its stream decides.
			deadline = time.Now()
			if !bind.StartedAt.IsZero() {
				deadline = bind.StartedAt.Add(j.Limits.WallTime() + b.grace(j, b.writableBytes(j)))
			}
		}
		defer r.killAt(ctx, deadline)()
		wait := b.eng.ContainerWait(context.WithoutCancel(ctx), r.containerID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
		select {
		case <-wait.Result:
		case err := <-wait.Error:
			return fmt.Errorf("wait: %w: %w", errTransient, err)
		}
		cctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
		insp, err = b.eng.ContainerInspect(cctx, r.containerID, client.ContainerInspectOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("inspect: %w: %w", errTransient, err)
		}
		c = insp.Container
	}
	if t, err := time.Parse(time.RFC3339Nano, c.State.FinishedAt); err == nil {
		r.res.EndedAt = t.UTC()
	}
	logs, err := b.eng.ContainerLogs(ctx, r.containerID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return fmt.Errorf("read the helper's stream back: %w: %w", errTransient, err)
	}
	defer logs.Close()
	pr, pw := io.Pipe()
	helperErr := &cappedBuffer{max: 16 << 10}
	go func() {
		pw.CloseWithError(demuxWhole(pw, helperErr, logs))
	}()
	col := newCollector(r)
	defer col.abort()
	streamErr := col.consume(pr)
	pr.CloseWithError(errors.New("stream consumer finished"))
	// Read whole (demuxWhole), the log is the helper's own account: it
	// writes the hello first and the starting frame before the command
	// starts, so a log with the hello and no starting frame proves that
	// nothing of the candidate ran. An empty log proves nothing (it may be
	// one that was lost).
	if streamErr == nil && col.hello && !col.starting && col.status == nil {
		why := "nothing after the hello"
		if col.helperError != "" {
			why = "the helper: " + col.helperError
		}
		return fmt.Errorf("the helper's stream ends before the command started (%s): %w", why, ErrNotRun)
	}
	if streamErr != nil || col.incomplete() != "" {
		col.finish(&r.res)
		why := col.incomplete()
		if streamErr != nil {
			why = streamErr.Error()
		}
		return fmt.Errorf("the helper's stream could not be recovered whole (%s)", why)
	}
	r.mu.Lock()
	hardKilled := r.hardKilled
	r.mu.Unlock()
	r.decide(ctx, col, c.State.OOMKilled, hardKilled, nil, nil, helperErr.String())
	return nil
}

// demuxWhole copies an engine's multiplexed log (an 8-byte header, stream
// and length, before each record) to stdout and stderr, as stdcopy does,
// but a log that ends inside a record is an error: stdcopy reads that as
// the end, and a record cut away could hold the frame that proves a job
// ran.
func demuxWhole(stdout, stderr io.Writer, r io.Reader) error {
	var hdr [8]byte
	buf := make([]byte, 32<<10)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("log record header: %w", err)
		}
		var w io.Writer
		switch stdcopy.StdType(hdr[0]) {
		case stdcopy.Stdout:
			w = stdout
		case stdcopy.Stderr:
			w = stderr
		default:
			return fmt.Errorf("log record of stream %d: %w", hdr[0], errProtocol)
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		if m, err := io.CopyBuffer(w, io.LimitReader(r, n), buf); err != nil {
			return err
		} else if m != n {
			return fmt.Errorf("log record cut after %d of %d bytes: %w", m, n, io.ErrUnexpectedEOF)
		}
	}
}

// writableBytes is the size of a job's writable inputs as stored.
func (b *Broker) writableBytes(j *sandbox.Job) int64 {
	var n int64
	for _, in := range j.Inputs {
		if in.Writable {
			if sz, err := b.blobs.Size(in.Digest); err == nil {
				n += sz
			}
		}
	}
	return n
}

// ShimEnder is an engine whose runtime can leave processes behind that no
// container record reaches (containerdengine: the shim of a task create
// cut short); EndOrphanedShims ends them and names their containers.
type ShimEnder interface {
	EndOrphanedShims(ctx context.Context) ([]string, error)
}

// EndOrphanedShims ends the engine's processes that serve no container
// (ShimEnder), if it has any such; it returns their container IDs.
func (b *Broker) EndOrphanedShims(ctx context.Context) ([]string, error) {
	if e, ok := b.eng.(ShimEnder); ok {
		return e.EndOrphanedShims(ctx)
	}
	return nil, nil
}
