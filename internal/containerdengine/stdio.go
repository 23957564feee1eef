package containerdengine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	ctrderrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/docker/go-units"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"
)

// A container's stdio: the shim writes stdout and stderr into regular
// files of the engine (they outlive this process, as Docker's log does),
// and reads stdin from a FIFO. An attach follows the files as they grow;
// the logs are the files.

func (e *Engine) ioDir(id string) string { return filepath.Join(e.cfg.StateDir, "io", id) }

func (e *Engine) makeIO(id string) (err error) {
	dir := e.ioDir(id)
	// A new directory: an ID is never used twice (newID), and one that
	// exists is another container's. Made here, it goes if not whole.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("container %s: stdio directory: %w", id, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	for _, f := range []string{"stdout", "stderr"} {
		fh, err := os.OpenFile(filepath.Join(dir, f), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("container %s: %s: %w", id, f, err)
		}
		fh.Close()
	}
	if err := unix.Mkfifo(filepath.Join(dir, "stdin"), 0o600); err != nil {
		return fmt.Errorf("container %s: stdin: %w", id, err)
	}
	return nil
}

// ContainerAttach creates the container's task with its stdin on a FIFO
// this process writes and returns the two output files, followed, as one
// multiplexed stream (Docker's attach framing).
func (e *Engine) ContainerAttach(ctx context.Context, id string, opts client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerAttachResult{}, err
	}
	if !opts.Stream || !opts.Stdin || !opts.Stdout || !opts.Stderr {
		return client.ContainerAttachResult{}, fmt.Errorf("attach %s: only a streaming attach of stdin, stdout and stderr is supported", c.ID())
	}
	dir := e.ioDir(c.ID())
	// Follow the outputs before the shim opens them, so that its close
	// (when the last process holding them is gone) is seen.
	var tails []*tail
	for _, name := range []string{"stdout", "stderr"} {
		t, err := newTail(filepath.Join(dir, name))
		if err != nil {
			for _, t := range tails {
				t.close()
			}
			return client.ContainerAttachResult{}, err
		}
		tails = append(tails, t)
	}
	pr, pw := io.Pipe()
	var mux sync.Mutex // the two outputs' frames, one at a time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, typ := range []stdcopy.StdType{stdcopy.Stdout, stdcopy.Stderr} {
		w := newFrameWriter(&mux, pw, typ)
		wg.Go(func() { tails[i].follow(w, stop) })
	}
	go func() {
		wg.Wait()
		// The stream ends first: closing an inotify instance waits for
		// the kernel's SRCU grace period (10-20 ms measured here), which
		// no reader of the stream needs to wait for.
		pw.Close()
		for _, t := range tails {
			t.close()
		}
	}()
	// Before a task exists, a failure stops the tails (the goroutine
	// above closes them) and ends the stream.
	abort := func() {
		close(stop)
		pr.Close()
	}
	// The FIFO opens in the background once the shim opens its end, and
	// fifo closes it if ctx ends first: a caller whose ctx ends when the
	// attach returns (the pool's, under its engine timeout) lost stdin
	// then, and the job's config met "writing to a closed fifo" (seen under
	// CPU load). The stream's own Close closes it.
	stdin, err := fifo.OpenFifo(context.WithoutCancel(ctx), filepath.Join(dir, "stdin"), syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		abort()
		return client.ContainerAttachResult{}, fmt.Errorf("attach %s: stdin: %w", c.ID(), err)
	}
	// Whoever comes next knows who holds stdin (see endOrphanedStdin).
	if _, err := c.SetLabels(ctx, map[string]string{labelAttacher: attacher(os.Getpid())}); err != nil {
		stdin.Close()
		abort()
		return client.ContainerAttachResult{}, err
	}
	info, err := infoOf(ctx, c)
	if err == nil {
		err = e.newTask(ctx, info, true)
	}
	if err != nil {
		stdin.Close()
		abort()
		return client.ContainerAttachResult{}, err
	}
	conn := &stdioConn{e: e, id: c.ID(), stdin: stdin, out: pr, stop: stop}
	return client.ContainerAttachResult{HijackedResponse: client.NewHijackedResponse(conn, "application/vnd.docker.multiplexed-stream")}, nil
}

// frameWriter frames what it is given as Docker's multiplexed stream
// does: one byte of stream type, three zero bytes, the length (big endian).
// The header and the bytes are two writes (no copy of the bytes), made
// under mu, which the writers of one stream share.
type frameWriter struct {
	mu  *sync.Mutex
	w   io.Writer
	typ stdcopy.StdType
	hdr [8]byte
}

func newFrameWriter(mu *sync.Mutex, w io.Writer, typ stdcopy.StdType) io.Writer {
	return &frameWriter{mu: mu, w: w, typ: typ}
}

func (f *frameWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hdr[0] = byte(f.typ)
	binary.BigEndian.PutUint32(f.hdr[4:8], uint32(len(p)))
	if _, err := f.w.Write(f.hdr[:]); err != nil {
		return 0, err
	}
	if _, err := f.w.Write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// tail follows a file the shim writes until the shim closes it.
type tail struct {
	f      *os.File
	notify *os.File // inotify
}

func newTail(path string) (*tail, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify %s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &tail{f: f, notify: os.NewFile(uintptr(fd), "inotify")}, nil
}

func (t *tail) close() {
	t.notify.Close()
	t.f.Close()
}

// follow copies the file to w as it grows, until its writer closed it and
// all of it was read, or stop is closed. It leaves the tail open: its
// owner closes it.
func (t *tail) follow(w io.Writer, stop <-chan struct{}) {
	buf := make([]byte, 256<<10)
	ev := make([]byte, 4096)
	closed := false
	for {
		n, err := t.f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			continue
		}
		if err != nil && err != io.EOF {
			return
		}
		if closed {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		// Wait for more, or for the close.
		t.notify.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		m, err := t.notify.Read(ev)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= m; {
			mask := uint32(ev[off+4]) | uint32(ev[off+5])<<8 | uint32(ev[off+6])<<16 | uint32(ev[off+7])<<24
			nameLen := int(uint32(ev[off+12]) | uint32(ev[off+13])<<8 | uint32(ev[off+14])<<16 | uint32(ev[off+15])<<24)
			if mask&unix.IN_CLOSE_WRITE != 0 {
				closed = true // read what is left, then stop
			}
			off += unix.SizeofInotifyEvent + nameLen
		}
	}
}

// stdioConn is the attach's connection: writes go to the task's stdin,
// reads come from the multiplexed outputs.
type stdioConn struct {
	e        *Engine
	id       string // the container's, and its task's
	stdin    io.WriteCloser
	out      *io.PipeReader
	stop     chan struct{}
	once, cw sync.Once
}

func (c *stdioConn) Read(p []byte) (int, error)  { return c.out.Read(p) }
func (c *stdioConn) Write(p []byte) (int, error) { return c.stdin.Write(p) }

// CloseWrite ends the task's stdin: this side of the FIFO, and the
// shim's own handle on it.
func (c *stdioConn) CloseWrite() error {
	var err error
	c.cw.Do(func() {
		err = c.stdin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, cerr := c.e.c.TaskService().CloseIO(c.e.ns(ctx), &tasks.CloseIORequest{ContainerID: c.id, Stdin: true}); cerr != nil && err == nil {
			err = ctrderrdefs.FromGRPC(cerr)
		}
	})
	return err
}

func (c *stdioConn) Close() error {
	c.once.Do(func() {
		c.CloseWrite()
		close(c.stop)
		c.out.Close()
	})
	return nil
}

func (c *stdioConn) LocalAddr() net.Addr              { return stdioAddr{} }
func (c *stdioConn) RemoteAddr() net.Addr             { return stdioAddr{} }
func (c *stdioConn) SetDeadline(time.Time) error      { return nil }
func (c *stdioConn) SetReadDeadline(time.Time) error  { return nil }
func (c *stdioConn) SetWriteDeadline(time.Time) error { return nil }
func (stdioAddr) Network() string                     { return "stdio" }
func (stdioAddr) String() string                      { return "stdio" }

type stdioAddr struct{}

var _ net.Conn = (*stdioConn)(nil)

// ContainerLogs returns what the container wrote, multiplexed as Docker's
// logs are. With the "local" log's max-size, only the last max-size bytes
// of each stream are kept, as Docker's one-file local log keeps them: a
// longer stream cannot be read back whole.
func (e *Engine) ContainerLogs(ctx context.Context, id string, opts client.ContainerLogsOptions) (client.ContainerLogsResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return nil, err
	}
	var lc container.LogConfig
	json.Unmarshal([]byte(labels[labelLog]), &lc)
	var limit int64 = -1
	if v := lc.Config["max-size"]; v != "" {
		if n, err := units.RAMInBytes(v); err == nil {
			limit = n
		}
	}
	dir := e.ioDir(c.ID())
	pr, pw := io.Pipe()
	go func() {
		var err error
		var mu sync.Mutex
		for _, s := range []struct {
			name string
			typ  stdcopy.StdType
			want bool
		}{{"stdout", stdcopy.Stdout, opts.ShowStdout}, {"stderr", stdcopy.Stderr, opts.ShowStderr}} {
			if !s.want || err != nil {
				continue
			}
			err = copyTail(newFrameWriter(&mu, pw, s.typ), filepath.Join(dir, s.name), limit)
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

func copyTail(w io.Writer, path string, limit int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if limit >= 0 && st.Size() > limit {
		if _, err := f.Seek(st.Size()-limit, io.SeekStart); err != nil {
			return err
		}
	}
	buf := make([]byte, 32<<10) // one frame of Docker's size at most
	_, err = io.CopyBuffer(w, io.LimitReader(f, st.Size()), buf)
	return err
}

// labelAttacher names the process holding a container's stdin: its pid
// and start time (so a reused pid is not taken for it).
const labelAttacher = "sandboxd.ctr/attacher"

func attacher(pid int) string {
	start, err := startTime(pid)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%s", pid, start)
}

// startTime is pid's start time as its stat says it: field 22, in clock
// ticks since boot (the command, field 2, may hold spaces but ends at the
// last ')').
func startTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], nil
}

// endOrphanedStdin ends the stdin of a container whose attaching process
// is gone, as Docker's attach stream ends with its client: the shim keeps
// the FIFO open for writing, so without this the helper would wait for
// its config until the job's deadline.
func (e *Engine) endOrphanedStdin(ctx context.Context, id string, labels map[string]string) {
	if labels[labelAttacher] == "" {
		return
	}
	pid, _, _ := strings.Cut(labels[labelAttacher], ":")
	n, err := strconv.Atoi(pid)
	if err != nil || attacher(n) == labels[labelAttacher] {
		return // still alive
	}
	e.c.TaskService().CloseIO(ctx, &tasks.CloseIORequest{ContainerID: id, Stdin: true})
}
