package broker

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/filedigest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Broker runs jobs on one engine.
type Broker struct {
	eng     Engine
	cfg     Config
	blobs   *store.Store
	log     *slog.Logger
	volumes *volumeCache
	pool    *pool // nil unless Config.PoolSize > 0

	shimDigest string
	shimTree   map[string]fileSum     // the helper volume's expected tree
	shimTar    func() ([]byte, error) // and its content, made once if ever needed

	stats Stats

	factsOnce sync.Once
	facts     sandbox.RuntimeFacts
	factsErr  error

	hostMu sync.Mutex
	host   *hostLimits         // once the engine told them
	trees  map[string][]string // image ID → its trees served from volumes (trees.go)
}

// New returns a broker. It takes the helper binary's digest (read and
// hashed, or remembered in Config.DigestMemo) and has no other side
// effects; engine state is touched only when a job runs.
func New(eng Engine, blobs *store.Store, cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shim, err := filedigest.Open(cfg.ShimPath, cfg.DigestMemo)
	if err != nil {
		return nil, fmt.Errorf("broker: helper binary: %w", err)
	}
	// An early word on a wrong helper; the bytes staged are checked again
	// when they are read (shimVolumeContent).
	if err := checkStaticFile(cfg.ShimPath); err != nil {
		return nil, fmt.Errorf("broker: helper %s: %w", cfg.ShimPath, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Broker{eng: eng, cfg: cfg, blobs: blobs, log: log}
	b.shimDigest, b.shimTree, b.shimTar = shimVolumeContent(shim)
	b.volumes = newVolumeCache(b)
	if cfg.PoolSize > 0 {
		b.pool = newPool(b, cfg.PoolSize, cfg.PoolIdle)
	}
	return b, nil
}

// Stats counts what the broker did to the engine since it was created.
type Stats struct {
	ContainersCreated atomic.Int64 // job containers
	VolumesPopulated  atomic.Int64 // cache volumes filled (helper, read-only inputs)
	VolumesChecked    atomic.Int64 // cache volumes read back and compared with their content
	BytesStaged       atomic.Int64 // writable input bytes sent into sandboxes

	PoolStarted   atomic.Int64 // sandboxes started ahead of their jobs
	PoolUsed      atomic.Int64 // jobs that ran in a pooled sandbox
	PoolDiscarded atomic.Int64 // pooled sandboxes a job found unusable and removed
	PoolReady     atomic.Int64 // pooled sandboxes ready now
	PoolStarting  atomic.Int64 // pooled sandboxes being started now
}

// Stats returns the broker's counters.
func (b *Broker) Stats() *Stats { return &b.stats }

// Facts returns the runtime facts recorded in receipts and results.
func (b *Broker) Facts(ctx context.Context) (sandbox.RuntimeFacts, error) {
	b.factsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
		defer cancel()
		v, err := b.eng.ServerVersion(ctx, client.ServerVersionOptions{})
		if err != nil {
			b.factsErr = fmt.Errorf("engine version: %w", err)
			return
		}
		engine := "docker"
		if v.Platform.Name == "containerd" {
			engine = "containerd"
		}
		b.facts = sandbox.RuntimeFacts{
			BrokerVersion: b.cfg.Version,
			Engine:        engine,
			EngineVersion: v.Version,
			EngineAPI:     v.APIVersion,
			Runtime:       sandbox.RuntimeRunc,
			SeccompDigest: seccomp.Digest(),
			ShimDigest:    b.shimDigest,
		}
	})
	return b.facts, b.factsErr
}

// Run executes one sealed job and returns its result. The returned error is
// non-nil only when the job was refused before anything ran (an invalid
// job, an image that is not a local ID, a conflicting container); every
// failure after that is reported in the Result's status.
func (b *Broker) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	return b.RunWithHooks(ctx, job, Hooks{})
}

// Hooks let a caller make each step durable before the next one happens.
type Hooks struct {
	// OnCreated runs right after the container is created, before it is
	// inspected or started. An error aborts the job: the container is
	// removed and nothing runs.
	OnCreated func(ctx context.Context, containerID string) error
	// OnStarted runs right after the container started.
	OnStarted func(containerID string, at time.Time)
	// OnFinished runs with the final result while the container still
	// exists. If it fails (the caller could not make the result durable),
	// the container is left in place so that Recover can read the job's
	// stream again after a restart.
	OnFinished func(ctx context.Context, res sandbox.Result) error
	// OnCollect, if set, runs at each step of the live collection of the
	// helper's stream (see CollectSteps). Crash tests use it to kill the
	// daemon at a precise point of a collection.
	OnCollect func(step string)
	// OnProgress, if set, is told the job's phase as it goes: "staging"
	// with the input bytes sent so far, "running", then "collecting" with
	// the bytes and files of the artifacts stored so far (-1: no count).
	// It is called from the broker's goroutines and must not block.
	OnProgress func(phase string, bytes, files int64)
	// ReclaimName says the caller proved that the job never ran and that
	// no container is bound to it (a restart proved it and queued the
	// job again). A create (or a pooled sandbox's rename) an earlier
	// process sent the engine may land after the restart freed the job's
	// container name: then the job's create meets it. With ReclaimName, such a container is removed and
	// the create made once more if it is what that process left: a
	// container of this job that never started, or a sandbox an earlier
	// process of this broker kept ready (no job's config is sent before
	// the binding). Anything else of the name still refuses the run
	// (ErrConflict).
	ReclaimName bool
}

func (h Hooks) progress(phase string, bytes, files int64) {
	if h.OnProgress != nil {
		h.OnProgress(phase, bytes, files)
	}
}

// CollectSteps are the steps Hooks.OnCollect is called at: the first
// artifact begun, half the output limit stored, the collection summary and
// the helper's status (the whole stream) received.
var CollectSteps = []string{"collect-begin", "collect-half", "collect-summary", "collect-status"}

// Preflight refuses a job before anything is created: an invalid or
// unsealed job, a runtime this broker does not allow, limits beyond what
// this host can give one container, an image that is not a local ID
// present in the engine, an input blob the store lacks.
func (b *Broker) Preflight(ctx context.Context, job sandbox.Job) error {
	_, err := b.preflight(ctx, job)
	return err
}

func (b *Broker) preflight(ctx context.Context, job sandbox.Job) (imagePath string, err error) {
	if err := job.VerifyDigest(); err != nil {
		return "", err
	}
	if job.Runtime == sandbox.RuntimeRunsc && !b.cfg.AllowRunsc {
		return "", &sandbox.FieldError{Field: "job.runtime", Reason: "runsc is not allowed by this broker"}
	}
	if nc, ok := b.eng.(NameChecker); ok {
		name := ContainerName(b.cfg.Name, job.ID, job.Digest)
		if err := nc.CheckContainerName(name); err != nil {
			return "", &sandbox.FieldError{Field: "job.id", Reason: fmt.Sprintf("this engine cannot name the job's container %q (%v): use an id of single separators between letters and digits, at most %d characters here", name, err, max(0, 76-len(ContainerName(b.cfg.Name, "", job.Digest))))}
		}
	}
	if err := b.checkHostLimits(ctx, job.Limits); err != nil {
		return "", err
	}
	imgPath, err := b.checkImage(ctx, job.Image)
	if err != nil {
		return "", err
	}
	if _, err := b.imageTrees(ctx, job.Image); err != nil {
		return "", err
	}
	for i, in := range job.Inputs {
		if !b.blobs.Has(in.Digest) {
			return "", &sandbox.FieldError{Field: fmt.Sprintf("job.inputs[%d].digest", i), Reason: fmt.Sprintf("blob %s is not in the store", in.Digest)}
		}
	}
	return imgPath, nil
}

// RunWithHooks is Run with callbacks at each step.
func (b *Broker) RunWithHooks(ctx context.Context, job sandbox.Job, hooks Hooks) (res sandbox.Result, err error) {
	log := b.log.With("job_id", job.ID)
	facts, err := b.Facts(ctx)
	if err != nil {
		return sandbox.Result{}, err
	}
	// Its inputs, and what it writes, stay in the store until it returns
	// (the caller has recorded its result by then).
	defer b.blobs.Hold(inputDigests(&job)...)()
	imgPath, err := b.preflight(ctx, job)
	if err != nil {
		return sandbox.Result{}, err
	}

	r := &run{b: b, job: &job, log: log, imagePath: imgPath, hooks: hooks}
	r.res = sandbox.Result{
		Schema:    sandbox.ResultSchema,
		JobID:     job.ID,
		JobDigest: job.Digest,
		Runtime:   facts,
		LimitsHit: []string{},
		Artifacts: []sandbox.Artifact{},
		Rejected:  []sandbox.Rejected{},
	}
	r.res.Runtime.Runtime = job.Runtime
	keep := false
	defer func() {
		if p := recover(); p != nil {
			log.Error("panic while running job", "panic", p)
			r.fail(sandbox.StatusError, fmt.Sprintf("broker panic: %v", p))
			res, err = r.res, nil
		}
		if !keep {
			r.cleanup()
		}
		// A sandbox of this shape could be made: keep some ready for the
		// next job like it.
		if b.pool != nil && r.poolKey != "" && r.containerID != "" {
			b.pool.want(job, r.poolKey)
		}
	}()
	if err := r.execute(ctx); err != nil {
		if errors.Is(err, sandbox.ErrConflict) {
			return sandbox.Result{}, err
		}
		if ctx.Err() != nil {
			r.fail(sandbox.StatusCancelled, "cancelled: "+context.Cause(ctx).Error())
		} else {
			r.fail(sandbox.StatusError, err.Error())
		}
	}
	if r.res.EndedAt.IsZero() {
		r.res.EndedAt = time.Now().UTC()
	}
	if r.res.StartedAt.IsZero() {
		r.res.StartedAt = r.res.EndedAt
	}
	r.bound()
	if hooks.OnFinished != nil && r.containerID != "" {
		if err := hooks.OnFinished(ctx, r.res); err != nil {
			keep = true
			return r.res, fmt.Errorf("record result (container %s kept for recovery): %w", r.containerID, err)
		}
	}
	return r.res, nil
}

// hostLimits are the most one container can be given on the engine's
// host, as the engine reports them.
type hostLimits struct {
	cpus   int
	memory int64
	driver string // the storage driver (Docker's; "" on containerd)
}

// hostLimitsOf asks the engine once (an answer is kept; an error is not).
func (b *Broker) hostLimitsOf(ctx context.Context) (hostLimits, error) {
	b.hostMu.Lock()
	defer b.hostMu.Unlock()
	if b.host != nil {
		return *b.host, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	info, err := b.eng.Info(ctx, client.InfoOptions{})
	if err != nil {
		return hostLimits{}, fmt.Errorf("engine info (the host's CPUs and memory): %w", err)
	}
	if info.Info.NCPU < 1 || info.Info.MemTotal <= 0 {
		return hostLimits{}, fmt.Errorf("engine info: the engine reports %d CPUs and %d bytes of memory", info.Info.NCPU, info.Info.MemTotal)
	}
	b.host = &hostLimits{cpus: info.Info.NCPU, memory: info.Info.MemTotal, driver: info.Info.Driver}
	return *b.host, nil
}

// checkHostLimits refuses, naming the limit, what asks more than this host
// can give one container: Docker refuses CPUs beyond the host's at create
// ("Range of CPUs is from 0.01 to 2.00"), after a receipt was signed, and
// containerd would set a quota that bounds nothing; a memory limit beyond
// the host's memory is no limit either.
func (b *Broker) checkHostLimits(ctx context.Context, l sandbox.Limits) error {
	h, err := b.hostLimitsOf(ctx)
	if err != nil {
		return err
	}
	if most := int64(h.cpus) * 1000; l.CPUMillis > most {
		return &sandbox.FieldError{Field: "job.limits.cpu_millis", Reason: fmt.Sprintf("%d (%s CPUs) is more than this host can give: at most %d (%d CPUs, as the engine reports)",
			l.CPUMillis, strconv.FormatFloat(float64(l.CPUMillis)/1000, 'f', -1, 64), most, h.cpus)}
	}
	if l.MemoryBytes > h.memory {
		return &sandbox.FieldError{Field: "job.limits.memory_bytes", Reason: fmt.Sprintf("%d bytes is more than this host can give: at most %d (its memory, as the engine reports)", l.MemoryBytes, h.memory)}
	}
	return nil
}

// checkImage refuses anything but a local image ID present in the engine
// and returns the image's default PATH.
func (b *Broker) checkImage(ctx context.Context, id string) (string, error) {
	if !sandbox.ValidDigest(id) {
		return "", fmt.Errorf("image %q: %w: only local image IDs (sha256:…) are accepted", id, sandbox.ErrImageRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	img, err := b.eng.ImageInspect(ctx, id)
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("image %s: %w: not present in the engine (images are never pulled)", id, sandbox.ErrImageRefused)
	}
	if err != nil {
		return "", fmt.Errorf("image %s: inspect: %w", id, err)
	}
	if img.ID != id {
		return "", fmt.Errorf("image %s: %w: the engine resolved it to %s", id, sandbox.ErrImageRefused, img.ID)
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if img.Config != nil {
		for _, kv := range img.Config.Env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				path = v
			}
		}
	}
	return path, nil
}

// removeContainer force-removes a container and its anonymous volumes. It
// uses its own context so that cleanup also happens after cancellation.
func (b *Broker) removeContainer(id string) error {
	_, err := b.removeFound(id)
	return err
}

// removeFound force-removes a container and says whether there was one
// (none is no error).
func (b *Broker) removeFound(id string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.EngineTimeout)
	defer cancel()
	_, err := b.eng.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	switch {
	case errdefs.IsNotFound(err):
		return false, nil
	case err != nil:
		b.log.Error("remove container", "container_id", id, "error", err)
		return false, err
	}
	return true, nil
}

// ensureShim makes sure the helper volume holds the helper binary.
func (b *Broker) ensureShim(ctx context.Context, image string) (string, error) {
	name := b.shimVolumeName(b.shimDigest)
	labels := map[string]string{LabelRole: roleShim, LabelDigest: b.shimDigest, LabelBroker: b.cfg.Name}
	_, err := b.volumes.ensure(ctx, name, image, sumsKey(b.shimTree), func() (volumeSource, error) {
		return volumeSource{labels: labels, sums: b.shimTree, open: func() (io.ReadCloser, error) {
			content, err := b.shimTar()
			if err != nil {
				return nil, err
			}
			return io.NopCloser(bytes.NewReader(content)), nil
		}}, nil
	})
	return name, err
}

// shimVolumeContent returns the helper's digest and the helper volume's
// expected tree, from the binary's digest taken once per broker (not once
// per job: hashing it is most of a warm job's CPU in this process), and
// the volume's tar, read and made only when a volume is populated (a
// one-shot process whose helper volume passed its check before never needs
// it). The bytes read then must still have the digest the volume is named
// by, and be a static executable.
func shimVolumeContent(shim filedigest.File) (string, map[string]fileSum, func() ([]byte, error)) {
	tree := map[string]fileSum{
		"shim":  {mode: 0o755, size: shim.Size, digest: strings.TrimPrefix(shim.Digest, "sha256:")},
		rootKey: volumeRoot(0o755, 0),
	}
	// Made once, when first needed; a failure is not kept (a transient
	// read error must not stop every later population).
	var mu sync.Mutex
	var made []byte
	content := func() ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if made != nil {
			return made, nil
		}
		bin, err := shim.Read()
		if errors.Is(err, filedigest.ErrChanged) {
			// A daemon reads the helper only when it first fills its
			// volume: replaced since it started, it must be restarted to
			// use (and name) the new one.
			return nil, fmt.Errorf("helper binary: %w (restart sandboxd to take the new helper)", err)
		}
		if err != nil {
			return nil, fmt.Errorf("helper binary: %w", err)
		}
		if err := checkStatic(bytes.NewReader(bin)); err != nil {
			return nil, fmt.Errorf("helper %s: %w", shim.Path, err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "shim", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg})
		tw.Write(bin)
		tw.Close()
		made = buf.Bytes()
		return made, nil
	}
	return shim.Digest, tree, content
}

// checkInput re-checks an input blob before it reaches a container: it
// must hash to its digest and be a canonical tar within the ceilings.
func (b *Broker) checkInput(ctx context.Context, digest string, maxBytes int64) (bundle.Summary, error) {
	f, err := b.blobs.Open(digest)
	if err != nil {
		return bundle.Summary{}, err
	}
	defer f.Close()
	lim := bundle.DefaultLimits()
	lim.MaxBytes = maxBytes
	return bundle.CheckTar(ctx, f, lim, digest)
}

// ensureInput makes sure a read-only input's volume holds its tree. The
// blob is re-checked first: one that does not match its digest or is not
// a canonical tar is never mounted.
func (b *Broker) ensureInput(ctx context.Context, image, digest string) (string, bool, error) {
	if _, err := b.checkInput(ctx, digest, bundle.DefaultLimits().MaxBytes); err != nil {
		return "", false, fmt.Errorf("input %s: %w", digest, err)
	}
	f, err := b.blobs.Open(digest)
	if err != nil {
		return "", false, err
	}
	want, err := treeSums(f, "", false)
	f.Close()
	if err != nil {
		return "", false, fmt.Errorf("input %s: not a valid tar: %w", digest, err)
	}
	want[rootKey] = volumeRoot(0o750, b.cfg.CandidateGID)
	name := b.inputVolumeName(digest)
	labels := map[string]string{LabelRole: roleInput, LabelDigest: digest, LabelBroker: b.cfg.Name}
	if n, err := b.blobs.Size(digest); err == nil {
		labels[LabelSize] = strconv.FormatInt(n, 10)
	}
	populated, err := b.volumes.ensure(ctx, name, image, sumsKey(want), func() (volumeSource, error) {
		return volumeSource{labels: labels, sums: want, open: func() (io.ReadCloser, error) {
			return b.blobs.Open(digest)
		}}, nil
	})
	if populated {
		b.stats.VolumesPopulated.Add(1)
	}
	return name, populated, err
}

// checkStaticFile is checkStatic of the file at path, reading only its
// headers.
func checkStaticFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return checkStatic(f)
}

// checkStatic refuses a helper that needs a dynamic loader: evaluator
// images need not have one.
func checkStatic(bin io.ReaderAt) error {
	f, err := elf.NewFile(bin)
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked; build it with CGO_ENABLED=0")
		}
	}
	return nil
}
