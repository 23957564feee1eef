package enginefake

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"
)

// Program is what a started container runs: it reads the attached stdin
// and writes stdout and stderr (multiplexed onto the attach stream and
// into the container's log, as the engine does), and returns the exit
// code. When the container is killed, stdin and stdout fail and the exit
// code is 137.
type Program func(c *Container, stdin io.Reader, stdout, stderr io.Writer) int

// Engine is the in-memory engine. Its methods are safe for concurrent use.
type Engine struct {
	mu         sync.Mutex
	next       int
	images     map[string]bool
	containers map[string]*Container // by ID
	volumes    map[string]*Volume
	calls      []string

	// Program runs in every container that is started; nil means the
	// container exits 0 at once.
	Program Program
	// Inspect, when set, changes what ContainerInspect reports of a
	// container: an engine that did not apply what it was asked.
	Inspect func(*container.InspectResponse)
	// InspectError, when set, is asked before each ContainerInspect of a
	// container that exists; what it returns (if not nil) is the answer:
	// an engine that could not read a container's state.
	InspectError func(id string) error
	// BeforeCreate, when set, runs at the start of each ContainerCreate,
	// outside the engine's lock: what another process does on the engine
	// just before a container is created.
	BeforeCreate func(client.ContainerCreateOptions)
	// RemoveError, when set, is what ContainerRemove answers (the
	// container stays): an engine that failed a removal.
	RemoveError error
	// NCPU and MemTotal are the host Info reports (New: 8 CPUs, 32 GiB).
	NCPU     int
	MemTotal int64
}

// Container is one container.
type Container struct {
	ID         string
	Name       string
	Config     *container.Config
	HostConfig *container.HostConfig
	Created    time.Time

	e        *Engine
	state    container.State
	log      bytes.Buffer
	attached net.Conn // the container's end of the attach stream
	killed   bool
	exited   chan struct{}
}

// Volume is one volume.
type Volume struct {
	Name    string
	Labels  map[string]string
	root    file
	files   map[string]file // by path below the root
	created time.Time
}

type file struct {
	dir  bool
	mode int64
	gid  int
	data []byte
}

// New returns an empty engine.
func New() *Engine {
	return &Engine{images: map[string]bool{}, containers: map[string]*Container{}, volumes: map[string]*Volume{}, NCPU: 8, MemTotal: 32 << 30}
}

// AddImage makes an image ID present.
func (e *Engine) AddImage(id string) {
	e.mu.Lock()
	e.images[id] = true
	e.mu.Unlock()
}

// Calls returns the calls made so far, as "method target" strings
// ("ContainerStart <id>", "ContainerCreate <name>", …).
func (e *Engine) Calls() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.calls...)
}

// Called reports how many calls of method were made on target.
func (e *Engine) Called(method, target string) int {
	n := 0
	for _, c := range e.Calls() {
		if c == method+" "+target {
			n++
		}
	}
	return n
}

func (e *Engine) record(method, target string) {
	e.calls = append(e.calls, method+" "+target)
}

// Container returns a container by ID or name, or nil.
func (e *Engine) Container(idOrName string) *Container {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lookup(idOrName)
}

// Containers returns the IDs of every container, sorted.
func (e *Engine) Containers() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id := range e.containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (e *Engine) lookup(idOrName string) *Container {
	if c, ok := e.containers[idOrName]; ok {
		return c
	}
	name := strings.TrimPrefix(idOrName, "/")
	for _, c := range e.containers {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func notFound(what, id string) error {
	return fmt.Errorf("no such %s: %s: %w", what, id, errdefs.ErrNotFound)
}

// clone deep-copies plain data through JSON, as the engine's API does.
func clone[T any](v *T) *T {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func (e *Engine) ImageInspect(ctx context.Context, id string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.images[id] {
		return client.ImageInspectResult{}, notFound("image", id)
	}
	var r client.ImageInspectResult
	r.ID = id
	return r, nil
}

// Info reports the host's CPUs and memory (NCPU, MemTotal).
func (e *Engine) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("Info", "")
	var r client.SystemInfoResult
	r.Info.NCPU, r.Info.MemTotal = e.NCPU, e.MemTotal
	return r, nil
}

func (e *Engine) ServerVersion(context.Context, client.ServerVersionOptions) (client.ServerVersionResult, error) {
	return client.ServerVersionResult{Version: "fake", APIVersion: "1.41"}, nil
}

func (e *Engine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	if e.BeforeCreate != nil {
		e.BeforeCreate(o)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("ContainerCreate", o.Name)
	if o.Config == nil || !e.images[o.Config.Image] {
		return client.ContainerCreateResult{}, notFound("image", fmt.Sprint(o.Config != nil && o.Config.Image != ""))
	}
	if o.Name != "" && e.lookup(o.Name) != nil {
		return client.ContainerCreateResult{}, fmt.Errorf("container name %q is already in use: %w", o.Name, errdefs.ErrConflict)
	}
	e.next++
	id := fmt.Sprintf("%064x", e.next)
	if o.Name == "" {
		o.Name = "c" + id[:12]
	}
	c := &Container{ID: id, Name: o.Name, Config: clone(o.Config), HostConfig: clone(o.HostConfig), Created: time.Now(), e: e, exited: make(chan struct{})}
	if c.HostConfig == nil {
		c.HostConfig = &container.HostConfig{}
	}
	c.state.Status = container.StateCreated
	for _, m := range c.HostConfig.Mounts {
		if m.Type == mount.TypeVolume {
			if _, ok := e.volumes[m.Source]; !ok {
				e.volumes[m.Source] = newVolume(m.Source, nil) // a named mount creates its volume, empty
			}
		}
	}
	e.containers[id] = c
	return client.ContainerCreateResult{ID: id}, nil
}

// defaultMasked are the paths the engine masks in an unprivileged container.
var defaultMasked = []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/sys/firmware"}
var defaultReadonly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"}

func (e *Engine) ContainerInspect(ctx context.Context, id string, _ client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	e.mu.Lock()
	c := e.lookup(id)
	if c == nil {
		e.mu.Unlock()
		return client.ContainerInspectResult{}, notFound("container", id)
	}
	if e.InspectError != nil {
		id := c.ID
		e.mu.Unlock()
		if err := e.InspectError(id); err != nil {
			return client.ContainerInspectResult{}, err
		}
		e.mu.Lock()
		if c = e.lookup(id); c == nil {
			e.mu.Unlock()
			return client.ContainerInspectResult{}, notFound("container", id)
		}
	}
	st := c.state
	r := container.InspectResponse{
		ID: c.ID, Name: "/" + c.Name, Image: c.Config.Image, Created: c.Created.Format(time.RFC3339Nano),
		State: &st, Config: clone(c.Config), HostConfig: clone(c.HostConfig),
	}
	e.mu.Unlock()
	if !r.HostConfig.Privileged {
		if r.HostConfig.MaskedPaths == nil {
			r.HostConfig.MaskedPaths = append([]string(nil), defaultMasked...)
		}
		if r.HostConfig.ReadonlyPaths == nil {
			r.HostConfig.ReadonlyPaths = append([]string(nil), defaultReadonly...)
		}
	}
	for _, m := range r.HostConfig.Mounts {
		r.Mounts = append(r.Mounts, container.MountPoint{Type: m.Type, Name: m.Source, Destination: m.Target, RW: !m.ReadOnly})
	}
	if e.Inspect != nil {
		e.Inspect(&r)
	}
	return client.ContainerInspectResult{Container: r}, nil
}

// pipeConn is the broker's end of an attach stream: CloseWrite ends the
// container's stdin, as on the engine's hijacked connection.
type pipeConn struct {
	net.Conn
	stdinW *io.PipeWriter
}

func (p *pipeConn) Write(b []byte) (int, error) { return p.stdinW.Write(b) }
func (p *pipeConn) CloseWrite() error           { return p.stdinW.Close() }
func (p *pipeConn) Close() error {
	p.stdinW.Close()
	return p.Conn.Close()
}

func (e *Engine) ContainerAttach(ctx context.Context, id string, _ client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("ContainerAttach", id)
	c := e.lookup(id)
	if c == nil {
		return client.ContainerAttachResult{}, notFound("container", id)
	}
	if c.attached != nil {
		return client.ContainerAttachResult{}, fmt.Errorf("container %s is attached already", id)
	}
	// stdout: a synchronous pipe from the container to the broker; stdin:
	// an io.Pipe, so that the broker can close it alone.
	brokerEnd, containerEnd := net.Pipe()
	stdinR, stdinW := io.Pipe()
	c.attached = &attachedConn{Conn: containerEnd, stdin: stdinR}
	return client.ContainerAttachResult{HijackedResponse: client.NewHijackedResponse(&pipeConn{Conn: brokerEnd, stdinW: stdinW}, "")}, nil
}

// attachedConn is the container's end: it reads stdin, writes stdout.
type attachedConn struct {
	net.Conn
	stdin *io.PipeReader
}

func (a *attachedConn) Read(b []byte) (int, error) { return a.stdin.Read(b) }
func (a *attachedConn) Close() error {
	a.stdin.CloseWithError(io.ErrClosedPipe)
	return a.Conn.Close()
}

func (e *Engine) ContainerStart(ctx context.Context, id string, _ client.ContainerStartOptions) (client.ContainerStartResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("ContainerStart", id)
	c := e.lookup(id)
	if c == nil {
		return client.ContainerStartResult{}, notFound("container", id)
	}
	if c.state.Status != container.StateCreated {
		return client.ContainerStartResult{}, fmt.Errorf("container %s is %s: %w", id, c.state.Status, errdefs.ErrConflict)
	}
	c.state.Status, c.state.Running = container.StateRunning, true
	c.state.StartedAt = time.Now().UTC().Format(time.RFC3339Nano)
	prog := e.Program
	var stdin io.Reader = strings.NewReader("")
	out := &muxWriter{e: e, c: c}
	if c.attached != nil {
		stdin = c.attached
		out.attached = c.attached
	}
	go func() {
		code := 0
		if prog != nil {
			code = prog(c, stdin, out.stream(stdcopy.Stdout), out.stream(stdcopy.Stderr))
		}
		c.exit(code)
	}()
	return client.ContainerStartResult{}, nil
}

// muxWriter multiplexes a container's stdout and stderr as the engine
// does (an 8-byte header: stream, three zero bytes, big-endian length)
// into its log and onto the attach stream.
type muxWriter struct {
	e        *Engine
	c        *Container
	mu       sync.Mutex // one record at a time on the attach stream
	attached io.Writer
}

func (m *muxWriter) stream(t stdcopy.StdType) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		rec := Mux(t, p)
		m.e.mu.Lock()
		m.c.log.Write(rec)
		m.e.mu.Unlock()
		if m.attached != nil {
			m.mu.Lock()
			defer m.mu.Unlock()
			if _, err := m.attached.Write(rec); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Mux returns p as one record of a multiplexed stream of type t
// (stdcopy.Stdout or stdcopy.Stderr), for SetLog.
func Mux(t stdcopy.StdType, p []byte) []byte {
	rec := make([]byte, 8, 8+len(p))
	rec[0] = byte(t)
	binary.BigEndian.PutUint32(rec[4:], uint32(len(p)))
	return append(rec, p...)
}

// exit ends a running container with code (137 if it was killed).
func (c *Container) exit(code int) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	if !c.state.Running {
		return
	}
	if c.killed {
		code = 137
	}
	c.state.Status, c.state.Running, c.state.ExitCode = container.StateExited, false, code
	c.state.FinishedAt = time.Now().UTC().Format(time.RFC3339Nano)
	if c.attached != nil {
		c.attached.Close()
	}
	close(c.exited)
}

// Exited is closed when the container has exited.
func (c *Container) Exited() <-chan struct{} { return c.exited }

// State returns the container's state.
func (c *Container) State() container.State {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.state
}

// SetState replaces the container's state (a container found in that
// state, as after a restart of the broker).
func (c *Container) SetState(s container.State) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.state = s
}

// SetLog replaces the container's log with a multiplexed stream.
func (c *Container) SetLog(b []byte) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.log.Reset()
	c.log.Write(b)
}

func (e *Engine) ContainerWait(ctx context.Context, id string, _ client.ContainerWaitOptions) client.ContainerWaitResult {
	res, errc := make(chan container.WaitResponse, 1), make(chan error, 1)
	e.mu.Lock()
	e.record("ContainerWait", id)
	c := e.lookup(id)
	e.mu.Unlock()
	if c == nil {
		errc <- notFound("container", id)
		return client.ContainerWaitResult{Result: res, Error: errc}
	}
	go func() {
		if c.State().Status == container.StateCreated || c.State().Running {
			select {
			case <-c.exited:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
		res <- container.WaitResponse{StatusCode: int64(c.State().ExitCode)}
	}()
	return client.ContainerWaitResult{Result: res, Error: errc}
}

func (e *Engine) ContainerKill(ctx context.Context, id string, _ client.ContainerKillOptions) (client.ContainerKillResult, error) {
	e.mu.Lock()
	e.record("ContainerKill", id)
	c := e.lookup(id)
	if c == nil {
		e.mu.Unlock()
		return client.ContainerKillResult{}, notFound("container", id)
	}
	if !c.state.Running {
		e.mu.Unlock()
		return client.ContainerKillResult{}, fmt.Errorf("container %s is not running: %w", id, errdefs.ErrConflict)
	}
	c.killed = true
	e.mu.Unlock()
	c.exit(137)
	return client.ContainerKillResult{}, nil
}

func (e *Engine) ContainerRemove(ctx context.Context, id string, o client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	e.mu.Lock()
	e.record("ContainerRemove", id)
	if e.RemoveError != nil {
		e.mu.Unlock()
		return client.ContainerRemoveResult{}, e.RemoveError
	}
	c := e.lookup(id)
	if c == nil {
		e.mu.Unlock()
		return client.ContainerRemoveResult{}, notFound("container", id)
	}
	if c.state.Running && !o.Force {
		e.mu.Unlock()
		return client.ContainerRemoveResult{}, fmt.Errorf("container %s is running: %w", id, errdefs.ErrConflict)
	}
	c.killed = true
	delete(e.containers, c.ID)
	e.mu.Unlock()
	c.exit(137)
	return client.ContainerRemoveResult{}, nil
}

func (e *Engine) ContainerRename(ctx context.Context, id string, o client.ContainerRenameOptions) (client.ContainerRenameResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("ContainerRename", id)
	c := e.lookup(id)
	if c == nil {
		return client.ContainerRenameResult{}, notFound("container", id)
	}
	if other := e.lookup(o.NewName); other != nil && other != c {
		return client.ContainerRenameResult{}, fmt.Errorf("container name %q is already in use: %w", o.NewName, errdefs.ErrConflict)
	}
	c.Name = o.NewName
	return client.ContainerRenameResult{}, nil
}

func (e *Engine) ContainerLogs(ctx context.Context, id string, _ client.ContainerLogsOptions) (client.ContainerLogsResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.lookup(id)
	if c == nil {
		return nil, notFound("container", id)
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(c.log.Bytes()))), nil
}

func matches(f client.Filters, labels map[string]string) bool {
	for want := range f["label"] {
		k, v, hasValue := strings.Cut(want, "=")
		got, ok := labels[k]
		if !ok || (hasValue && got != v) {
			return false
		}
	}
	return true
}

func (e *Engine) ContainerList(ctx context.Context, o client.ContainerListOptions) (client.ContainerListResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out client.ContainerListResult
	for _, c := range e.containers {
		if (!o.All && !c.state.Running) || !matches(o.Filters, c.Config.Labels) {
			continue
		}
		out.Items = append(out.Items, container.Summary{ID: c.ID, Names: []string{"/" + c.Name}, Image: c.Config.Image,
			Labels: c.Config.Labels, State: c.state.Status, Created: c.Created.Unix()})
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].ID < out.Items[j].ID })
	return out, nil
}

// SetCreated backdates a container's creation.
func (c *Container) SetCreated(t time.Time) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.Created = t
}

func newVolume(name string, labels map[string]string) *Volume {
	return &Volume{Name: name, Labels: labels, root: file{dir: true, mode: 0o755}, files: map[string]file{}, created: time.Now()}
}

func (v *Volume) api() volume.Volume {
	return volume.Volume{Name: v.Name, Labels: v.Labels, Driver: "local", CreatedAt: v.created.Format(time.RFC3339)}
}

func (e *Engine) VolumeCreate(ctx context.Context, o client.VolumeCreateOptions) (client.VolumeCreateResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("VolumeCreate", o.Name)
	v, ok := e.volumes[o.Name]
	if !ok { // an existing volume keeps its labels, as on the engine
		v = newVolume(o.Name, o.Labels)
		e.volumes[o.Name] = v
	}
	return client.VolumeCreateResult{Volume: v.api()}, nil
}

func (e *Engine) VolumeInspect(ctx context.Context, name string, _ client.VolumeInspectOptions) (client.VolumeInspectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[name]
	if !ok {
		return client.VolumeInspectResult{}, notFound("volume", name)
	}
	return client.VolumeInspectResult{Volume: v.api()}, nil
}

// VolumeRemove removes a volume no container mounts; as on the engine,
// force does not remove one in use.
func (e *Engine) VolumeRemove(ctx context.Context, name string, _ client.VolumeRemoveOptions) (client.VolumeRemoveResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("VolumeRemove", name)
	if _, ok := e.volumes[name]; !ok {
		return client.VolumeRemoveResult{}, notFound("volume", name)
	}
	for _, c := range e.containers {
		for _, m := range c.HostConfig.Mounts {
			if m.Type == mount.TypeVolume && m.Source == name {
				return client.VolumeRemoveResult{}, fmt.Errorf("remove %s: volume is in use - [%s]: %w", name, c.ID, errdefs.ErrConflict)
			}
		}
	}
	delete(e.volumes, name)
	return client.VolumeRemoveResult{}, nil
}

// SetVolumeCreated backdates a volume's creation.
func (e *Engine) SetVolumeCreated(name string, t time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.volumes[name]; ok {
		v.created = t
	}
}

func (e *Engine) VolumeList(ctx context.Context, o client.VolumeListOptions) (client.VolumeListResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out client.VolumeListResult
	for _, v := range e.volumes {
		if matches(o.Filters, v.Labels) {
			out.Items = append(out.Items, v.api())
		}
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].Name < out.Items[j].Name })
	return out, nil
}

// RemoveVolume removes a volume behind the broker's back.
func (e *Engine) RemoveVolume(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.volumes, name)
}

// volumeAt returns the volume mounted at dir in c and the path below it.
func (e *Engine) volumeAt(c *Container, p string) (*Volume, string, bool) {
	for _, m := range c.HostConfig.Mounts {
		if m.Type != mount.TypeVolume {
			continue
		}
		if p == m.Target {
			return e.volumes[m.Source], "", true
		}
		if rest, ok := strings.CutPrefix(p, m.Target+"/"); ok {
			return e.volumes[m.Source], rest, true
		}
	}
	return nil, "", false
}

func (e *Engine) CopyToContainer(ctx context.Context, id string, o client.CopyToContainerOptions) (client.CopyToContainerResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.record("CopyToContainer", id)
	c := e.lookup(id)
	if c == nil {
		return client.CopyToContainerResult{}, notFound("container", id)
	}
	tr := tar.NewReader(o.Content)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return client.CopyToContainerResult{}, nil
		}
		if err != nil {
			return client.CopyToContainerResult{}, err
		}
		full := path.Join(o.DestinationPath, h.Name)
		v, rel, ok := e.volumeAt(c, full)
		if !ok || v == nil {
			return client.CopyToContainerResult{}, fmt.Errorf("%s: read-only file system (only volumes are writable in this fake)", full)
		}
		f := file{mode: h.Mode & 0o7777}
		if o.CopyUIDGID {
			f.gid = h.Gid
		}
		switch h.Typeflag {
		case tar.TypeDir:
			f.dir = true
		case tar.TypeReg:
			if f.data, err = io.ReadAll(tr); err != nil {
				return client.CopyToContainerResult{}, err
			}
		default:
			return client.CopyToContainerResult{}, fmt.Errorf("%s: type %q not supported by this fake", full, h.Typeflag)
		}
		if rel == "" {
			v.root = f
			continue
		}
		v.files[rel] = f
	}
}

func (e *Engine) CopyFromContainer(ctx context.Context, id string, o client.CopyFromContainerOptions) (client.CopyFromContainerResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.lookup(id)
	if c == nil {
		return client.CopyFromContainerResult{}, notFound("container", id)
	}
	v, rel, ok := e.volumeAt(c, o.SourcePath)
	if !ok || v == nil || rel != "" {
		return client.CopyFromContainerResult{}, notFound("path", o.SourcePath)
	}
	base := path.Base(o.SourcePath)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: base + "/", Typeflag: tar.TypeDir, Mode: v.root.mode, Gid: v.root.gid})
	names := make([]string, 0, len(v.files))
	for n := range v.files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := v.files[n]
		h := &tar.Header{Name: base + "/" + n, Mode: f.mode, Gid: f.gid, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.dir {
			h.Name += "/"
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		tw.WriteHeader(h)
		tw.Write(f.data)
	}
	tw.Close()
	return client.CopyFromContainerResult{Content: io.NopCloser(&buf)}, nil
}

// WriteFile places a file in a volume behind the broker's back.
func (e *Engine) WriteFile(vol, name string, data []byte, mode int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[vol]
	if !ok {
		return notFound("volume", vol)
	}
	v.files[name] = file{mode: mode, data: data}
	return nil
}
