package broker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The pool keeps sandboxes created, checked and started before the jobs
// that will use them arrive, so that a job does not wait for the engine's
// container start (most of a no-op job's time; see BENCHMARKS.md).
//
// What makes a pooled sandbox exactly a cold one:
//   - The helper learns its job only from the config frame on stdin; the
//     container's own settings never depend on the command, its
//     environment or its outputs. A pooled container is created from the
//     spec the job itself would get (containerSpec of planFor), with only
//     its name and labels different: its key is the digest of that spec
//     without them, so a job only ever takes a container whose spec is its
//     own.
//   - Before a job takes one, the container is inspected again and checked
//     with checkInspected against the job's own spec, as a cold container
//     is before its start, and it must still be running with its helper
//     waiting: nothing but the helper ran in it.
//   - Each pooled container serves at most one job: it leaves the pool
//     under the lock, and the job removes it like any other.
//   - Jobs with read-only inputs mount volumes chosen by the job and are
//     never pooled.
//
// A pooled container carries no job's labels. Its binding to a job is what
// the caller journals through Hooks.OnCreated; a container of a previous
// process that no journal names is stale (ListStalePoolContainers). A
// process's pooled containers carry its generation, so that a reaper never
// takes the live pool for stale.
type pool struct {
	b    *Broker
	size int
	idle time.Duration
	gen  string

	mu       sync.Mutex
	closed   bool
	retiring bool // retireLoop runs
	shapes   map[string]*shape
	// owned are the containers of this generation the broker still holds:
	// being started, ready, or taken by a job that has not removed it. Any
	// other of this generation was lost (a failed removal, a create that
	// completed after it was given up) and is stale.
	owned map[string]bool
	fills sync.WaitGroup
	stop  chan struct{}
}

// shape is one pool key: a container spec and its ready sandboxes.
type shape struct {
	job      sandbox.Job // a job of this shape, for its spec
	ready    []*pooled
	starting int
	lastUsed time.Time
}

// pooled is a started sandbox whose helper waits for its config frame.
type pooled struct {
	id    string
	key   string
	nonce string
	att   client.HijackedResponse
	spec  client.ContainerCreateOptions
}

// Pool labels.
const (
	LabelPool    = "sandboxd.pool"     // the generation of the process that started a pooled container
	LabelPoolKey = "sandboxd.pool.key" // the digest of its spec (poolKey)
	rolePool     = "pool"
)

func newPool(b *Broker, size int, idle time.Duration) *pool {
	var g [8]byte
	rand.Read(g[:])
	return &pool{b: b, size: size, idle: idle, gen: hex.EncodeToString(g[:]), shapes: map[string]*shape{}, owned: map[string]bool{}, stop: make(chan struct{})}
}

// poolable reports whether a job may run in a pooled sandbox.
func poolable(j *sandbox.Job) bool {
	for _, in := range j.Inputs {
		if !in.Writable {
			return false
		}
	}
	return true
}

// poolKey is the digest of a container spec without what differs between
// two containers of the same settings: the name, the labels and the
// helper's stream nonce (only that entry of the environment).
func poolKey(spec client.ContainerCreateOptions) string {
	cfg := *spec.Config
	cfg.Labels = nil
	cfg.Env = slices.DeleteFunc(slices.Clone(cfg.Env), func(kv string) bool { return strings.HasPrefix(kv, shim.NonceEnv+"=") })
	b, err := json.Marshal(struct {
		Config     container.Config
		HostConfig *container.HostConfig
	}{cfg, spec.HostConfig})
	if err != nil {
		panic(fmt.Sprintf("pool key: %v", err)) // plain data: cannot happen
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// take returns a ready sandbox of the key, or nil. The caller owns it.
func (p *pool) take(key string) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.shapes[key]
	if s == nil || p.closed {
		return nil
	}
	s.lastUsed = time.Now()
	if len(s.ready) == 0 {
		return nil
	}
	c := s.ready[0]
	s.ready = s.ready[1:]
	p.b.stats.PoolReady.Add(-1)
	return c
}

// maxShapes bounds the shapes kept ready at once: a submitter varying one
// limit per job must not make the broker keep PoolSize sandboxes for
// each. The least recently used shape makes room for a new one.
const maxShapes = 4

// want keeps the pool of a job's shape full: it is called once a job of
// that shape has run, so that only shapes in use, on images that already
// ran a job, are ever pooled.
func (p *pool) want(j sandbox.Job, key string) {
	var drop []*pooled
	defer func() {
		for _, c := range drop {
			p.discard(c)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	s := p.shapes[key]
	if s == nil {
		if len(p.shapes) >= maxShapes {
			var oldest *shape
			for _, o := range p.shapes {
				if oldest == nil || o.lastUsed.Before(oldest.lastUsed) {
					oldest = o
				}
			}
			drop = p.dropLocked(func(o *shape) bool { return o == oldest })
		}
		s = &shape{job: j}
		p.shapes[key] = s
		if !p.retiring {
			p.retiring = true
			go p.retireLoop()
		}
	}
	s.lastUsed = time.Now()
	for len(s.ready)+s.starting < p.size {
		s.starting++
		p.b.stats.PoolStarting.Add(1)
		p.fills.Add(1)
		go p.fill(key, s)
	}
}

// fill starts one sandbox of a shape and adds it to the pool, if that
// shape is still the pool's (it may have been retired, and its key used by
// a new shape, meanwhile).
func (p *pool) fill(key string, s *shape) {
	defer p.fills.Done()
	c, err := p.start(key, s.job)
	p.mu.Lock()
	s.starting--
	p.b.stats.PoolStarting.Add(-1)
	switch {
	case err != nil:
		p.mu.Unlock()
		p.b.log.Warn("pool: start a sandbox", "error", err)
		return
	case p.shapes[key] != s || p.closed:
		p.mu.Unlock()
		p.discard(c)
		return
	}
	s.ready = append(s.ready, c)
	p.b.stats.PoolReady.Add(1)
	p.mu.Unlock()
}

// start creates, checks, attaches and starts a sandbox of the job's spec.
func (p *pool) start(key string, j sandbox.Job) (*pooled, error) {
	b := p.b
	var nonce, name [16]byte
	rand.Read(nonce[:])
	rand.Read(name[:8])
	c := &pooled{key: key, nonce: hex.EncodeToString(nonce[:])}
	labels := map[string]string{
		LabelBroker:  b.cfg.Name,
		LabelRole:    rolePool,
		LabelPool:    p.gen,
		LabelPoolKey: key,
		LabelStream:  c.nonce,
	}
	// Never cancelled but by its timeout: a create cancelled on this side
	// may still complete in the engine, after the removal by name.
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.EngineTimeout)
	defer cancel()
	// The shape's job ran in this process: its image's answer is kept.
	trees, err := b.imageTrees(ctx, j.Image)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	c.spec = b.containerSpec(b.planFor(&j, labels, trees))
	c.spec.Name = b.cfg.Name + "-pool-" + hex.EncodeToString(name[:8])
	if got := poolKey(c.spec); got != key {
		return nil, fmt.Errorf("pool: spec of key %s is now %s", key, got)
	}
	created, err := b.eng.ContainerCreate(ctx, c.spec)
	if err != nil {
		b.removeContainer(c.spec.Name)
		return nil, fmt.Errorf("create: %w", err)
	}
	c.id = created.ID
	p.own(c.id)
	fail := func(err error) (*pooled, error) {
		if c.att.Conn != nil {
			c.att.Close()
		}
		b.removeContainer(c.id)
		p.release(c.id)
		return nil, err
	}
	insp, err := b.eng.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	if err != nil {
		return fail(fmt.Errorf("inspect: %w", err))
	}
	if _, err := b.checkInspected(c.spec, insp.Container); err != nil {
		return fail(err)
	}
	for _, m := range c.spec.HostConfig.Mounts {
		if err := b.volumes.stillChecked(ctx, m.Source); err != nil {
			return fail(err)
		}
	}
	att, err := b.eng.ContainerAttach(ctx, c.id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return fail(fmt.Errorf("attach: %w", err))
	}
	c.att = att.HijackedResponse
	if _, err := b.eng.ContainerStart(ctx, c.id, client.ContainerStartOptions{}); err != nil {
		return fail(fmt.Errorf("start: %w", err))
	}
	b.stats.PoolStarted.Add(1)
	return c, nil
}

// discard removes a pooled sandbox that no job will use.
func (p *pool) discard(c *pooled) {
	c.att.Close()
	p.b.removeContainer(c.id)
	p.release(c.id)
}

func (p *pool) own(id string) {
	p.mu.Lock()
	p.owned[id] = true
	p.mu.Unlock()
}

// release forgets a container that was removed (or whose removal failed:
// the reaper retries it as stale).
func (p *pool) release(id string) {
	p.mu.Lock()
	delete(p.owned, id)
	p.mu.Unlock()
}

func (p *pool) owns(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.owned[id]
}

// retireLoop drops the sandboxes of shapes no job used for p.idle.
func (p *pool) retireLoop() {
	t := time.NewTicker(max(p.idle/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		drop := p.dropLocked(func(s *shape) bool { return time.Since(s.lastUsed) >= p.idle })
		p.mu.Unlock()
		for _, c := range drop {
			p.discard(c)
		}
	}
}

// dropLocked forgets the shapes that match and returns their ready
// sandboxes, for the caller to discard once the lock is released.
func (p *pool) dropLocked(match func(*shape) bool) []*pooled {
	var drop []*pooled
	for key, s := range p.shapes {
		if match(s) {
			drop = append(drop, s.ready...)
			p.b.stats.PoolReady.Add(-int64(len(s.ready)))
			delete(p.shapes, key)
		}
	}
	return drop
}

// close removes every ready sandbox and waits for the ones starting.
func (p *pool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stop)
	drop := p.dropLocked(func(*shape) bool { return true })
	p.mu.Unlock()
	for _, c := range drop {
		p.discard(c)
	}
	p.fills.Wait()
}

// ClosePool removes the broker's ready sandboxes and waits for those being
// started. Jobs already running are not affected; no sandbox is pooled
// afterwards.
func (b *Broker) ClosePool() {
	if b.pool != nil {
		b.pool.close()
	}
}

// PoolCounts returns the sandboxes ready in the pool and being started,
// and how many jobs ran in a pooled sandbox so far.
func (b *Broker) PoolCounts() (ready, starting, used int) {
	return int(b.stats.PoolReady.Load()), int(b.stats.PoolStarting.Load()), int(b.stats.PoolUsed.Load())
}

// ListStalePoolContainers returns the pooled containers of this broker's
// name that another process (an earlier one) started, and those of this
// process it no longer holds. The caller removes those no journaled job
// names, after a grace period; a sandbox this process is starting, keeps
// ready or a job of it holds is never listed.
func (b *Broker) ListStalePoolContainers(ctx context.Context) ([]JobContainer, error) {
	f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+rolePool)
	cs, err := b.eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list pooled containers: %w", err)
	}
	var out []JobContainer
	for _, c := range cs.Items {
		if b.pool != nil && c.Labels[LabelPool] == b.pool.gen && b.pool.owns(c.ID) {
			continue
		}
		jc := JobContainer{ID: c.ID, State: string(c.State), Created: time.Unix(c.Created, 0)}
		if len(c.Names) > 0 {
			jc.Name = c.Names[0]
		}
		out = append(out, jc)
	}
	return out, nil
}

// errPoolStale marks a pooled sandbox that may not serve a job.
var errPoolStale = errors.New("pooled sandbox not usable")

// checkPooled inspects a pooled sandbox before a job takes it: it must
// still run, never have been OOM-killed, and have exactly the settings the
// job's own spec asks for.
func (b *Broker) checkPooled(ctx context.Context, c *pooled, jobSpec client.ContainerCreateOptions) (sandbox.Security, error) {
	ictx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	insp, err := b.eng.ContainerInspect(ictx, c.id, client.ContainerInspectOptions{})
	switch {
	case isNotFound(err):
		return sandbox.Security{}, fmt.Errorf("%w: gone", errPoolStale)
	case err != nil && ctx.Err() == nil:
		// A sandbox the engine cannot say the state of (the containerd
		// engine: its task unread) serves no job; the job starts cold.
		return sandbox.Security{}, fmt.Errorf("%w: inspect: %w", errPoolStale, err)
	case err != nil:
		return sandbox.Security{}, fmt.Errorf("inspect pooled sandbox: %w", err) // a cancelled job's
	}
	got := insp.Container
	if got.State == nil || !got.State.Running || got.State.OOMKilled || got.State.Restarting {
		return sandbox.Security{}, fmt.Errorf("%w: not running", errPoolStale)
	}
	if got.Config == nil || got.Config.Labels[LabelRole] != rolePool || got.Config.Labels[LabelPool] != b.pool.gen ||
		got.Config.Labels[LabelStream] != c.nonce || got.Config.Labels[LabelPoolKey] != poolKey(jobSpec) {
		return sandbox.Security{}, fmt.Errorf("%w: labels are not this pool's", errPoolStale)
	}
	sec, err := b.checkInspected(jobSpec, got)
	if err != nil {
		return sandbox.Security{}, err
	}
	for _, m := range jobSpec.HostConfig.Mounts {
		if err := b.volumes.stillChecked(ctx, m.Source); err != nil {
			return sandbox.Security{}, err
		}
	}
	return sec, nil
}
