package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// run is the state of one job's execution.
type run struct {
	b         *Broker
	job       *sandbox.Job
	log       *slog.Logger
	imagePath string
	trees     []string // the image's directories served from volumes
	unpin     []func() // the pins of their volumes
	hooks     Hooks

	containerID string
	nonce       string // the helper's stream nonce
	poolKey     string // the job's pool key, if it is poolable
	pooled      bool   // the container came from the pool
	res         sandbox.Result
	failed      bool
	// maxResult bounds the signed result (0: sandbox.MaxResultBytes);
	// tests lower it.
	maxResult int64

	mu         sync.Mutex
	hardKilled bool
}

func (r *run) fail(status sandbox.Status, cause string) {
	if r.failed {
		return
	}
	r.failed = true
	r.res.Status = status
	r.res.Cause = clip(cause, maxCauseBytes)
	r.res.Limit = ""
}

// maxCauseBytes bounds a result's cause, which may quote what the sandbox
// wrote (the helper's error and stderr, a path in a broken stream).
const maxCauseBytes = 32 << 10

// bound keeps the result within the signed result's bound (fitResult)
// before anyone records it.
func (r *run) bound() {
	max := r.maxResult
	if max == 0 {
		max = sandbox.MaxResultBytes
	}
	dropped, err := fitResult(&r.res, max)
	switch {
	case err != nil:
		// Only a broker bug gets here: what is left is its own account.
		r.log.Error("result over its bound", "error", err)
		r.res.Artifacts, r.res.Rejected = []sandbox.Artifact{}, []sandbox.Rejected{}
		r.res.Status, r.res.Limit = sandbox.StatusError, ""
		r.res.Cause = "the result could not be kept within its bound: " + err.Error()
	case dropped > 0:
		r.log.Error("artifacts dropped from a result over its bound", "dropped", dropped, "max_bytes", max)
	}
}

func (r *run) cleanup() {
	if r.containerID != "" {
		r.b.removeContainer(r.containerID)
		if r.pooled {
			r.b.pool.release(r.containerID)
		}
	}
}

func (r *run) execute(ctx context.Context) error {
	b, j := r.b, r.job
	defer func() {
		for _, unpin := range r.unpin {
			unpin()
		}
	}()
	var (
		writable     []sandbox.Input
		hardDeadline time.Time
		att          client.HijackedResponse
	)
	for attempt := 1; ; attempt++ {
		// Staging: the read-only inputs' cache volumes, then the writable
		// inputs streamed to the helper (writeStdin counts their bytes).
		r.hooks.progress("staging", -1, -1)
		w, inputBytes, err := r.prepareInputs(ctx)
		if err != nil {
			return err
		}
		writable = w
		// The hard deadline covers staging and collection too; the helper
		// enforces the wall time on the command itself.
		hardDeadline = time.Now().Add(j.Limits.WallTime() + b.grace(j, inputBytes))
		att, err = r.sandbox(ctx, hardDeadline)
		if err == nil {
			break
		}
		// A volume checked for the job and removed before its container
		// mounted it (the collection of another process of this broker)
		// is staged again, a few times at most.
		if !errors.Is(err, errVolumeGone) || attempt == maxStageAttempts {
			return err
		}
		r.log.Warn("an input volume was removed before the job's container mounted it; staging again", "error", err)
	}
	defer att.Close()
	// The deadline is enforced from outside: kill the container.
	defer r.killAt(ctx, hardDeadline)()

	col := newCollector(r)
	defer col.abort()
	stdinErr := make(chan error, 1)
	go func() {
		err := r.writeStdin(ctx, att.Conn, writable, col)
		if err != nil {
			r.kill() // a half-staged job must not run
		}
		att.CloseWrite()
		stdinErr <- err
	}()

	pr, pw := io.Pipe()
	helperErr := &cappedBuffer{max: 16 << 10}
	go func() {
		_, err := stdcopy.StdCopy(pw, helperErr, att.Reader)
		pw.CloseWithError(err)
	}()
	streamErr := col.consume(pr)
	pr.CloseWithError(errors.New("stream consumer finished"))

	// Wait for the container to stop; no timeout here: the deadline above
	// kills it, and cancellation kills it too.
	wait := b.eng.ContainerWait(context.WithoutCancel(ctx), r.containerID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-wait.Result:
	case err := <-wait.Error:
		return fmt.Errorf("wait: %w", err)
	}
	r.res.EndedAt = time.Now().UTC()
	werr := <-stdinErr

	inspect := func() (client.ContainerInspectResult, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.EngineTimeout)
		defer cancel()
		return b.eng.ContainerInspect(cctx, r.containerID, client.ContainerInspectOptions{})
	}
	final, err := inspect()
	if err != nil && !isNotFound(err) {
		// Once more: the stream is whole, and one failed read of the
		// engine (the containerd engine's of the task) would throw it away.
		time.Sleep(200 * time.Millisecond)
		final, err = inspect()
	}
	if err != nil {
		return fmt.Errorf("inspect exited container: %w", err)
	}
	state := final.Container.State
	if state == nil {
		return errors.New("inspect exited container: no state")
	}
	r.mu.Lock()
	hardKilled := r.hardKilled
	r.mu.Unlock()
	r.decide(ctx, col, state.OOMKilled, hardKilled, werr, streamErr, helperErr.String())
	return nil
}

// maxStageAttempts bounds how often a job stages its inputs again because
// a volume was removed before its container mounted it.
const maxStageAttempts = 3

// grace is how long past its wall time a job's container may live: the
// time to stage its inputs and collect its outputs, at 50 MiB/s.
func (b *Broker) grace(j *sandbox.Job, inputBytes int64) time.Duration {
	return b.cfg.CollectGrace + time.Duration((inputBytes+j.Limits.OutputBytes)/(50<<20))*time.Second
}

// sandbox gives the job a started container whose helper waits for its
// config frame: one from the pool if a ready one has the job's exact
// settings, else a new one. It returns the attached stream.
func (r *run) sandbox(ctx context.Context, hardDeadline time.Time) (client.HijackedResponse, error) {
	b, j := r.b, r.job
	var nonce [16]byte
	rand.Read(nonce[:])
	spec := b.containerSpec(b.planFor(j, map[string]string{
		LabelJob:       j.ID,
		LabelJobDigest: j.Digest,
		LabelDeadline:  strconv.FormatInt(hardDeadline.UnixMilli(), 10),
		LabelBroker:    b.cfg.Name,
		LabelRole:      roleJob,
		LabelStream:    hex.EncodeToString(nonce[:]),
	}, r.trees))
	if b.pool != nil && poolable(j) {
		key := poolKey(spec)
		r.poolKey = key
		for ctx.Err() == nil {
			c := b.pool.take(key)
			if c == nil {
				break
			}
			att, err := r.takePooled(ctx, c, spec)
			if err == nil {
				return att, nil
			}
			if r.containerID == c.id {
				return client.HijackedResponse{}, err // the job's now: removed with it
			}
			if !errors.Is(err, errPoolStale) && !errors.As(err, new(*SettingError)) {
				return client.HijackedResponse{}, err // the job's error, not the pool's
			}
			// Not the job's container yet: a cold one, checked in turn,
			// takes its place.
			r.log.Error("pooled sandbox discarded", "container_id", c.id, "error", err)
		}
	}
	return r.startCold(ctx, spec)
}

// takePooled binds a pooled sandbox to the job, or discards it: on every
// path that does not bind it (an error, a panic), it is removed.
func (r *run) takePooled(ctx context.Context, c *pooled, spec client.ContainerCreateOptions) (att client.HijackedResponse, err error) {
	defer func() {
		if r.containerID == c.id {
			return
		}
		r.b.pool.discard(c)
		r.b.stats.PoolDiscarded.Add(1)
	}()
	return r.bindPooled(ctx, c, spec)
}

// bindPooled checks a pooled sandbox against the job's spec and makes it
// the job's: it takes the job's container name, so that the engine refuses
// a second run of the job as it refuses a second create (ErrConflict), and
// recovery finds the job's name on it. From then on it is the job's
// container and is removed with the job.
func (r *run) bindPooled(ctx context.Context, c *pooled, spec client.ContainerCreateOptions) (client.HijackedResponse, error) {
	b := r.b
	sec, err := b.checkPooled(ctx, c, spec)
	if err != nil {
		return client.HijackedResponse{}, err
	}
	err = r.takeName(ctx, spec.Name, func(ctx context.Context) error {
		_, err := b.eng.ContainerRename(ctx, c.id, client.ContainerRenameOptions{NewName: spec.Name})
		return err
	})
	if errdefs.IsConflict(err) {
		return client.HijackedResponse{}, fmt.Errorf("container %s already exists: %w", spec.Name, sandbox.ErrConflict)
	}
	if err != nil {
		return client.HijackedResponse{}, fmt.Errorf("name the pooled sandbox: %w", err)
	}
	r.containerID = c.id
	r.pooled = true
	r.nonce = c.nonce
	r.res.Security = sec
	r.log = r.log.With("container_id", c.id, "pooled", true)
	b.stats.PoolUsed.Add(1)
	if r.hooks.OnCreated != nil {
		if err := r.hooks.OnCreated(ctx, c.id); err != nil {
			c.att.Close()
			return client.HijackedResponse{}, fmt.Errorf("record pooled container: %w", err)
		}
	}
	r.res.StartedAt = time.Now().UTC()
	if r.hooks.OnStarted != nil {
		r.hooks.OnStarted(c.id, r.res.StartedAt)
	}
	return c.att, nil
}

// startCold creates, checks, attaches and starts a container for the job.
func (r *run) startCold(ctx context.Context, spec client.ContainerCreateOptions) (client.HijackedResponse, error) {
	b := r.b
	var none client.HijackedResponse
	r.nonce = spec.Config.Labels[LabelStream]
	var created client.ContainerCreateResult
	err := r.takeName(ctx, spec.Name, func(ctx context.Context) (err error) {
		created, err = b.eng.ContainerCreate(ctx, spec)
		return err
	})
	if errdefs.IsConflict(err) {
		return none, fmt.Errorf("container %s already exists: %w", spec.Name, sandbox.ErrConflict)
	}
	if err != nil {
		// The engine may have created it although the call failed (a
		// timeout on our side): remove it by its name, which is ours.
		b.removeContainer(spec.Name)
		return none, fmt.Errorf("create container: %w", err)
	}
	b.stats.ContainersCreated.Add(1)
	// The cache volumes the container mounts must still be the ones that
	// were checked (one removed meanwhile would have been created empty).
	// From here on they stay: the engine refuses to remove a volume a
	// container mounts. Checked before OnCreated: a container removed
	// here was never the job's, and the job is bound to one container.
	for _, m := range spec.HostConfig.Mounts {
		if err := b.volumes.stillChecked(ctx, m.Source); err != nil {
			if rerr := b.removeContainer(created.ID); rerr != nil {
				// Staging again would create a second container of
				// the job's name: this one is still there.
				// (%v: not errVolumeGone, so no retry).
				return none, fmt.Errorf("%v; and its container %s could not be removed: %w", err, created.ID, rerr)
			}
			return none, err
		}
	}
	r.containerID = created.ID
	r.log = r.log.With("container_id", created.ID)
	if r.hooks.OnCreated != nil {
		if err := r.hooks.OnCreated(ctx, created.ID); err != nil {
			return none, fmt.Errorf("record created container: %w", err)
		}
	}

	cctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	insp, err := b.eng.ContainerInspect(cctx, created.ID, client.ContainerInspectOptions{})
	cancel()
	if err != nil {
		return none, fmt.Errorf("inspect created container: %w", err)
	}
	sec, err := b.checkInspected(spec, insp.Container)
	if err != nil {
		return none, err
	}
	r.res.Security = sec

	att, err := b.eng.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return none, fmt.Errorf("attach: %w", err)
	}

	cctx, cancel = context.WithTimeout(ctx, b.cfg.EngineTimeout)
	_, err = b.eng.ContainerStart(cctx, created.ID, client.ContainerStartOptions{})
	cancel()
	if err != nil {
		att.Close()
		return none, fmt.Errorf("start: %w", err)
	}
	r.res.StartedAt = time.Now().UTC()
	if r.hooks.OnStarted != nil {
		r.hooks.OnStarted(created.ID, r.res.StartedAt)
	}
	return att.HijackedResponse, nil
}

// takeName makes the engine call that gives a container the job's name
// (a create, a rename), bounded by the engine timeout. If the name is
// taken and the caller's proof lets the run reclaim it (reclaimName),
// the call is made once more.
func (r *run) takeName(ctx context.Context, name string, call func(context.Context) error) error {
	once := func() error {
		cctx, cancel := context.WithTimeout(ctx, r.b.cfg.EngineTimeout)
		defer cancel()
		return call(cctx)
	}
	err := once()
	if errdefs.IsConflict(err) && r.reclaimName(ctx, name) {
		err = once()
	}
	return err
}

// reclaimName frees the job's container name of what an earlier
// process's create (or rename) left there, landed after a restart freed
// the name (Hooks.ReclaimName): a container of this job that never
// started, or a sandbox an earlier process of this broker kept ready. It
// reports whether the name is free to try once more. Anything else of
// the name is kept: the caller's proof does not cover it.
func (r *run) reclaimName(ctx context.Context, name string) bool {
	b := r.b
	if !r.hooks.ReclaimName {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	insp, err := b.eng.ContainerInspect(cctx, name, client.ContainerInspectOptions{})
	cancel()
	if isNotFound(err) {
		// Gone since the conflict; or, on containerd, a name an earlier
		// process's create took and never recorded a container under,
		// which a removal by the name frees (as RemoveUnboundContainer).
		_, err := b.removeFound(name)
		return err == nil
	}
	if err != nil || insp.Container.Config == nil || insp.Container.State == nil {
		return false
	}
	c, labels := insp.Container, insp.Container.Config.Labels
	created := ofJob(labels, r.job) && neverStarted(c.State)
	keptReady := b.ofEarlierPool(labels)
	if !created && !keptReady {
		r.log.Warn("a container of the job's name is not what an earlier process left; kept", "container_id", c.ID, "state", c.State.Status)
		return false
	}
	// Removed, or gone since it was inspected: either way the name is free.
	if _, err := b.removeFound(c.ID); err != nil {
		return false
	}
	r.log.Info("removed a container of the job's name that an earlier process's engine call left after the restart; the job never ran in it",
		"container_id", c.ID, "pooled", keptReady)
	return true
}

// prepareInputs makes the helper volume, the image's tree volumes and every
// read-only input's volume ready and re-checks every writable input. These
// are independent (their own volumes, their own blobs), so they run at
// once: on a cold broker each volume check is a create, an archive read and
// a remove on the engine.
// It returns the writable inputs and their total content bytes.
func (r *run) prepareInputs(ctx context.Context) ([]sandbox.Input, int64, error) {
	b, j := r.b, r.job
	trees, err := b.imageTrees(ctx, j.Image)
	if err != nil {
		return nil, 0, err
	}
	r.trees = trees
	names := make([]string, len(trees))
	for i, dir := range trees {
		names[i] = b.treeVolumeName(j.Image, dir)
	}
	// An image's tree has no blob a queued job pins: its volumes are
	// pinned here until the job ends (execute).
	r.unpin = append(r.unpin, b.volumes.pin(names...))
	errs := make([]error, 2+len(j.Inputs))
	sizes := make([]int64, len(j.Inputs))
	var wg sync.WaitGroup
	// Each goroutine turns a panic into its error, as RunWithHooks does
	// for its own.
	do := func(slot int, fn func() error) {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[slot] = fmt.Errorf("broker panic: %v", p)
				}
			}()
			errs[slot] = fn()
		})
	}
	do(0, func() error {
		if _, err := b.ensureShim(ctx, j.Image); err != nil {
			return fmt.Errorf("helper volume: %w", err)
		}
		return nil
	})
	do(1, func() error { return b.ensureTrees(ctx, j.Image, trees) })
	var writable []sandbox.Input
	for i, in := range j.Inputs {
		if in.Writable {
			// Checked as it is sent (sendInput); its size sets the
			// deadline now.
			writable = append(writable, in)
			n, err := b.blobs.Size(in.Digest)
			if err != nil {
				return nil, 0, fmt.Errorf("input %s: %w", in.Name, err)
			}
			sizes[i] = n
			continue
		}
		do(2+i, func() error {
			vol, populated, err := b.ensureInput(ctx, j.Image, in.Digest)
			if err != nil {
				return fmt.Errorf("input %s: %w", in.Name, err)
			}
			r.log.Debug("read-only input ready", "input", in.Name, "volume", vol, "populated", populated)
			return nil
		})
	}
	wg.Wait()
	// The first failure in job order, as when these ran one by one.
	for _, err := range errs {
		if err != nil {
			return nil, 0, err
		}
	}
	var total int64
	for _, n := range sizes {
		total += n
	}
	return writable, total, nil
}

// decide sets the result's status from what was observed, in order of
// authority: cancellation, the outside deadline, the engine's OOM flag,
// then the helper's report.
func (r *run) decide(ctx context.Context, col *collector, oomKilled, hardKilled bool, stdinErr, streamErr error, helperStderr string) {
	res := &r.res
	col.finish(res)
	st := col.status
	if st != nil {
		res.ExitCode = st.ExitCode
		res.Usage.WallTimeMS = st.DurationMS
		res.Usage.WorkBytesUsed = st.ScratchUsed[sandbox.WorkPath]
		res.Usage.TmpBytesUsed = st.ScratchUsed[sandbox.TmpPath]
		res.Stdout.Total = max(res.Stdout.Total, st.StdoutTotal)
		res.Stderr.Total = max(res.Stderr.Total, st.StderrTotal)
		res.Stdout.Truncated = res.Stdout.Total > res.Stdout.Bytes
		res.Stderr.Truncated = res.Stderr.Total > res.Stderr.Bytes
		for _, l := range st.LimitsHit {
			if knownLimit(l) {
				addLimit(res, l)
			}
		}
	}
	if res.Stdout.Truncated || res.Stderr.Truncated {
		addLimit(res, "log_bytes")
	}
	sort.Strings(res.LimitsHit)
	switch {
	case ctx.Err() != nil:
		r.fail(sandbox.StatusCancelled, "cancelled: "+context.Cause(ctx).Error())
	case hardKilled:
		r.fail(sandbox.StatusTimedOut, "killed by the broker at the hard deadline")
	case oomKilled && (st == nil || !st.CodeUIDRan) || st != nil && st.OOMKilled:
		// The engine's word, or the helper's count of the memory
		// cgroup's kills (the engine's may come after the exit). Not the
		// engine's once the exec service ran a program of the code uid,
		// as the helper does not count it then: the process killed may
		// have been that program, the candidate's code, whose end the
		// grader judges; a grader killed itself has no whole report. A
		// job whose helper gave no status takes the engine's word.
		r.fail(sandbox.StatusOOMKilled, "the memory limit was reached")
	case stdinErr != nil:
		r.fail(sandbox.StatusError, "staging inputs: "+stdinErr.Error())
	case col.helperError != "":
		r.fail(sandbox.StatusError, "helper: "+col.helperError+detail(helperStderr))
	case streamErr != nil:
		r.fail(sandbox.StatusError, "result stream: "+streamErr.Error()+detail(helperStderr))
	case col.incomplete() != "":
		r.fail(sandbox.StatusError, "result stream incomplete: "+col.incomplete()+detail(helperStderr))
	case st.Leftover:
		r.fail(sandbox.StatusError, st.Error)
	case st.TimedOut:
		r.fail(sandbox.StatusTimedOut, fmt.Sprintf("the command ran past its wall time of %dms", r.job.Limits.WallTimeMS))
	default:
		if l := decidingLimit(res.LimitsHit); l != "" {
			res.Status = sandbox.StatusLimitExceeded
			res.Limit = l
			res.Cause = "limit reached: " + l
		} else if st.ExitCode == 0 {
			res.Status = sandbox.StatusSucceeded
		} else {
			res.Status = sandbox.StatusFailed
			if st.Signal != "" {
				res.Cause = "killed by " + clip(st.Signal, 64)
			}
		}
	}
}

// decidingLimit returns the limit that decides a limit_exceeded status.
// Truncated logs are flagged but do not change the status: logs are never
// evidence for a verdict.
func decidingLimit(hit []string) string {
	for _, l := range []string{"disk_bytes", "output_bytes", "file_count", "file_size_bytes", "pids"} {
		if slices.Contains(hit, l) {
			return l
		}
	}
	return ""
}

// knownLimit reports whether l is the JSON name of a limit: the only
// names a result lists as hit, whatever the sandbox's stream says.
func knownLimit(l string) bool {
	switch l {
	case "wall_time_ms", "cpu_millis", "memory_bytes", "pids", "disk_bytes",
		"output_bytes", "log_bytes", "file_count", "open_files", "file_size_bytes":
		return true
	}
	return false
}

func addLimit(res *sandbox.Result, l string) {
	if !slices.Contains(res.LimitsHit, l) {
		res.LimitsHit = append(res.LimitsHit, l)
	}
}

func detail(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// killAt is the one deadline killer: it kills the container at deadline
// (the run is then hard-killed: timed out) or when ctx ends, whichever
// comes first, until the returned stop is called.
func (r *run) killAt(ctx context.Context, deadline time.Time) (stop func()) {
	killer := time.AfterFunc(time.Until(deadline), func() {
		r.mu.Lock()
		r.hardKilled = true
		r.mu.Unlock()
		r.kill()
	})
	stopOnCancel := context.AfterFunc(ctx, r.kill)
	return func() {
		killer.Stop()
		stopOnCancel()
	}
}

func (r *run) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), r.b.cfg.EngineTimeout)
	defer cancel()
	_, err := r.b.eng.ContainerKill(ctx, r.containerID, client.ContainerKillOptions{Signal: "SIGKILL"})
	if err != nil && !errdefs.IsNotFound(err) && !errdefs.IsConflict(err) {
		r.log.Warn("kill container", "error", err)
	}
}

// helperConfig is what the helper is told about the job.
func (r *run) helperConfig(writable []sandbox.Input) shim.Config {
	j := r.job
	env := map[string]string{"PATH": r.imagePath, "HOME": sandbox.WorkPath}
	for k, v := range j.Env {
		env[k] = v
	}
	env["HOSTNAME"] = "sandbox"
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	envList := make([]string, 0, len(keys))
	for _, k := range keys {
		envList = append(envList, k+"="+env[k])
	}
	var inputs []string
	for _, in := range writable {
		inputs = append(inputs, in.Path)
	}
	var mk []string
	if under(j.WorkDir, sandbox.WorkPath) || under(j.WorkDir, sandbox.TmpPath) {
		mk = append(mk, j.WorkDir)
	}
	mk = append(mk, j.Outputs...)
	return shim.Config{
		Argv:        j.Argv,
		Env:         envList,
		WorkDir:     j.WorkDir,
		UID:         r.b.cfg.CandidateUID,
		GID:         r.b.cfg.CandidateGID,
		CodeUID:     r.b.cfg.CodeUID,
		CodeGID:     r.b.cfg.CodeGID,
		CodeTmp:     codeTmp(r.b.cfg.CodeUID),
		Inputs:      inputs,
		MakeDirs:    mk,
		Outputs:     j.Outputs,
		Scratch:     []string{sandbox.WorkPath, sandbox.TmpPath},
		DeadlineMS:  j.Limits.WallTimeMS,
		LogBytes:    j.Limits.LogBytes,
		OutputBytes: j.Limits.OutputBytes,
		FileCount:   j.Limits.FileCount,
		FileSize:    j.Limits.FileSize,
		MaxInput:    j.Limits.DiskBytes,
	}
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// writeStdin sends the config frame and the writable inputs, checking
// each input as it streams (sendInput), then the go-ahead: an input that
// fails its check (a blob that changed on disk, a tar the rules refuse)
// aborts the job before anything runs on it (the helper may have
// extracted what it was sent: it runs nothing before the go-ahead).
func (r *run) writeStdin(ctx context.Context, w io.Writer, writable []sandbox.Input, col *collector) error {
	cfg, err := json.Marshal(r.helperConfig(writable))
	if err != nil {
		return err
	}
	if err := shim.WriteFrame(w, shim.FrameConfig, cfg); err != nil {
		return fmt.Errorf("send config: %w", err)
	}
	if len(writable) > 0 {
		// No input goes to a helper that has not said hello: one of
		// another version (a sandboxd-shim left from another release)
		// might run on inputs before the go-ahead.
		<-col.heard
		if !col.hello {
			return fmt.Errorf("the helper did not say %q (a sandboxd-shim of another version?): no input was sent", strings.TrimSpace(shim.Hello))
		}
	}
	staged := &stagedCounter{hooks: r.hooks}
	if r.hooks.OnProgress != nil {
		w = io.MultiWriter(w, staged)
	}
	for _, in := range writable {
		if err := r.sendInput(ctx, w, in); err != nil {
			return err
		}
	}
	if len(writable) > 0 {
		// Every byte sent was checked: the helper may run the command.
		if _, err := w.Write([]byte{shim.GoAhead}); err != nil {
			return fmt.Errorf("send the go-ahead: %w", err)
		}
	}
	r.hooks.progress("running", staged.n, -1)
	return nil
}

// stagedCounter reports the bytes sent to the helper as staging progress.
type stagedCounter struct {
	hooks Hooks
	n     int64
}

func (c *stagedCounter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	c.hooks.progress("staging", c.n, -1)
	return len(p), nil
}

func (r *run) sendInput(ctx context.Context, w io.Writer, in sandbox.Input) error {
	f, err := r.b.blobs.Open(in.Digest)
	if err != nil {
		return fmt.Errorf("input %s: %w", in.Name, err)
	}
	defer f.Close()
	if err := shim.WriteInputHeader(w, f.Size()); err != nil {
		return fmt.Errorf("input %s: %w", in.Name, err)
	}
	// The bytes sent are the bytes checked: the blob's digest and the tar
	// rules (checkInput's), over the stream as it goes. The helper
	// extracts it meanwhile (as the candidate's uid, into the job's
	// tmpfs; a check that fails stops the stream within a few MiB), and
	// runs nothing on it before the go-ahead that follows the last input
	// checked (writeStdin).
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("broker panic: %v", p)
			}
			pr.CloseWithError(errCheckEnded) // a check that stopped early stops the copy
			checked <- err
		}()
		lim := bundle.DefaultLimits()
		lim.MaxBytes = r.job.Limits.DiskBytes
		_, err = bundle.CheckTar(ctx, pr, lim, in.Digest)
	}()
	n, err := copyHashed(w, f, pw)
	pw.CloseWithError(err) // nil: the end of the stream
	cerr := <-checked
	r.b.stats.BytesStaged.Add(n)
	switch {
	case cerr != nil && (err == nil || errors.Is(err, errCheckEnded) || !errors.Is(cerr, err)):
		// The check's own verdict (not the send's failure passed on to
		// it): the input is at fault, whatever happened to the send.
		if err != nil && !errors.Is(err, errCheckEnded) {
			return fmt.Errorf("input %s: %w (and its send failed: %v)", in.Name, cerr, err)
		}
		return fmt.Errorf("input %s: %w", in.Name, cerr)
	case err != nil && !errors.Is(err, errCheckEnded):
		return fmt.Errorf("input %s: send: %w", in.Name, err)
	case err != nil:
		return fmt.Errorf("input %s: its check ended before the input was sent, and passed", in.Name)
	case n != f.Size():
		return fmt.Errorf("input %s: blob changed on disk (read %d bytes, want %d)", in.Name, n, f.Size())
	}
	return nil
}

// errCheckEnded is what a copy into an input's check meets once the
// check has ended (early: it failed).
var errCheckEnded = errors.New("the input's check ended")

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *cappedBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf)
}

// planFor decides a job's container: every name in it is derived from the
// job and content digests, so a recovering broker derives the same plan.
// trees are the image's directories served from volumes (imageTrees).
func (b *Broker) planFor(j *sandbox.Job, labels map[string]string, trees []string) *plan {
	p := &plan{
		job:        j,
		name:       ContainerName(b.cfg.Name, j.ID, j.Digest),
		labels:     labels,
		shimVolume: b.shimVolumeName(b.shimDigest),
		tmpfs:      tmpfsMounts(j.Limits, ids{b.cfg.CandidateUID, b.cfg.CandidateGID}, ids{b.cfg.CodeUID, b.cfg.CodeGID}),
		seccomp:    string(seccomp.JSON()),
	}
	for _, in := range j.Inputs {
		if !in.Writable {
			p.roVolumes = append(p.roVolumes, mount.Mount{
				Type: mount.TypeVolume, Source: b.inputVolumeName(in.Digest), Target: in.Path, ReadOnly: true,
				VolumeOptions: &mount.VolumeOptions{NoCopy: true},
			})
		}
	}
	for _, dir := range trees {
		p.roVolumes = append(p.roVolumes, mount.Mount{
			Type: mount.TypeVolume, Source: b.treeVolumeName(j.Image, dir), Target: dir, ReadOnly: true,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true},
		})
	}
	return p
}

// codeTmp is the code uid's tmpfs (tmpfsMounts), if there is a code uid.
func codeTmp(codeUID int) string {
	if codeUID > 0 {
		return sandbox.CodeTmpPath
	}
	return ""
}
