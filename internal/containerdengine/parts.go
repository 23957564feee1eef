package containerdengine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/system"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/filedigest"
)

// containerd reports its own version, never those of the binaries it
// starts for a task: the runc shim, and the runtime the shim runs. A check
// of the sandbox (a self-check's pass, kept for the processes after it) is
// only as good as the binaries it ran; one replaced on disk (an upgrade of
// runc with no reboot, containerd running on) would leave that pass
// answering for binaries it never ran. So ServerVersion names, as the
// engine's parts, each binary by its path and digest: containerd's runc
// shim and the runc it runs, found as containerd and the shim find them,
// and the binary of every other job runtime (runsc's wrapper, and what the
// wrapper says it runs). A part that cannot be found or read is named so,
// and marked unknown (its Details' "Unknown"): a check's pass is not kept
// for a key with an unknown part (selfcheck.Key.Unknown), since nothing
// would tell a binary replaced under it.

// runsLine, in a runtime wrapper (a script: runsc's, written by
// scripts/setup), names a binary the wrapper runs: its digest is one of the
// engine's parts too. "# sandboxd-runs: /absolute/path", one per line.
const runsLine = "# sandboxd-runs: "

// maxWrapper bounds the bytes of a runtime binary read for runsLine lines:
// a wrapper is a short script; a binary is not read for them at all.
const maxWrapper = 64 << 10

// parts names the binaries that run this engine's containers (see above).
// Every part is named, whatever went wrong finding it.
func (e *Engine) parts() []system.ComponentVersion {
	memo := filepath.Join(e.cfg.StateDir, "digests")
	var out []system.ComponentVersion
	unknown := func(name, version string) {
		out = append(out, system.ComponentVersion{Name: name, Version: version, Details: map[string]string{"Unknown": version}})
	}
	add := func(name, path string, err error) {
		if err != nil {
			unknown(name, "unknown: "+err.Error())
			return
		}
		f, err := filedigest.Open(path, memo)
		if err != nil {
			unknown(name, path+" unreadable: "+err.Error())
			return
		}
		out = append(out, system.ComponentVersion{Name: name, Version: path + " " + f.Digest})
	}
	where, err := containerdProcess(e.cfg.Address)
	if err != nil {
		add(shimBinary, "", err)
		add("runtime runc", "", err)
	} else {
		// Every shim containerd may run: it keeps the one it found first
		// for its life, which may be another than it would find now.
		shims := where.shimPaths(shimBinary)
		if len(shims) == 0 {
			add(shimBinary, "", fmt.Errorf("%s is in none of containerd's working directory, PATH (%s) and executable's directory", shimBinary, where.path))
		}
		for _, p := range shims {
			add(shimBinary, p, nil)
		}
		runc, err := where.lookPath("runc")
		add("runtime runc", runc, err)
	}
	for name, bin := range e.runtimes {
		if name == "runc" {
			continue // above: the shim finds it in containerd's PATH
		}
		add("runtime "+name, bin, nil)
		runs, err := wrapperRuns(bin)
		if err != nil {
			add("runtime "+name+" runs", "", err)
		}
		for _, p := range runs {
			add("runtime "+name+" runs", p, nil)
		}
	}
	return out
}

// wrapperRuns returns the binaries a runtime wrapper names in its runsLine
// lines; none for a file that is not a script ("#!"). A script longer than
// maxWrapper is refused rather than read in part.
func wrapperRuns(path string) ([]string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxWrapper+1))
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(b, []byte("#!")) {
		return nil, nil
	}
	if len(b) > maxWrapper {
		return nil, fmt.Errorf("%s is a script of more than %d bytes: too long for a runtime wrapper", path, maxWrapper)
	}
	var runs []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, maxWrapper), maxWrapper)
	for sc.Scan() {
		p, ok := strings.CutPrefix(sc.Text(), runsLine)
		if !ok {
			continue
		}
		if p = strings.TrimSpace(p); !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%s names %q, not an absolute path", path, p)
		}
		runs = append(runs, filepath.Clean(p))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return runs, nil
}

// containerdSide is what containerd finds binaries by: its PATH (the
// shim's too: containerd starts it with its own environment), its working
// directory and its executable's directory.
type containerdSide struct {
	path   string // the PATH variable
	cwd    string
	exeDir string
}

// containerdProcess reads containerd's side from its process, found by
// the peer credentials of its socket: a process whose executable is named
// containerd (not a forwarder, nor systemd holding an activated socket),
// the same process before and after the read (its start time: a pid is
// reused). containerd must run in this process's mount namespace: its
// paths are read here as they are there.
func containerdProcess(address string) (containerdSide, error) {
	c, err := net.DialTimeout("unix", address, 5*time.Second)
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's process: %w", err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's process: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return containerdSide{}, fmt.Errorf("containerd's process: %w", err)
	}
	if cerr != nil {
		return containerdSide{}, fmt.Errorf("containerd's process: %w", cerr)
	}
	if cred.Pid <= 0 {
		return containerdSide{}, errors.New("containerd's process is not visible from here (another pid namespace)")
	}
	pid := int(cred.Pid)
	proc := "/proc/" + strconv.Itoa(pid)
	started, err := startTime(pid)
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's process: %w", err)
	}
	exe, err := os.Readlink(proc + "/exe")
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's executable: %w", err)
	}
	if name := filepath.Base(strings.TrimSuffix(exe, " (deleted)")); name != "containerd" {
		return containerdSide{}, fmt.Errorf("the process behind %s is %s, not containerd", address, exe)
	}
	side, err := readSide(proc)
	if err != nil {
		return containerdSide{}, err
	}
	if again, err := startTime(pid); err != nil || again != started {
		return containerdSide{}, fmt.Errorf("containerd's process (pid %d) ended while it was read", cred.Pid)
	}
	return side, nil
}

// readSide reads a process's side from its /proc directory.
func readSide(proc string) (containerdSide, error) {
	mine, err1 := os.Readlink("/proc/self/ns/mnt")
	theirs, err2 := os.Readlink(proc + "/ns/mnt")
	if err := errors.Join(err1, err2); err != nil {
		return containerdSide{}, fmt.Errorf("containerd's mount namespace: %w", err)
	}
	if mine != theirs {
		return containerdSide{}, errors.New("containerd runs in another mount namespace: its binaries cannot be read from here")
	}
	env, err := os.ReadFile(proc + "/environ")
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's environment: %w", err)
	}
	var s containerdSide
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			s.path = v
		}
	}
	if s.cwd, err = os.Readlink(proc + "/cwd"); err != nil {
		return containerdSide{}, fmt.Errorf("containerd's working directory: %w", err)
	}
	exe, err := os.Readlink(proc + "/exe")
	if err != nil {
		return containerdSide{}, fmt.Errorf("containerd's executable: %w", err)
	}
	s.exeDir = filepath.Dir(exe)
	return s, nil
}

// shimPaths lists every shim binary containerd may run, in the order it
// looks: in its working directory (the runtime's name,
// io.containerd.runc.v2, is a relative path there: any file), in each
// directory of its PATH (an executable one), beside its own executable
// (any file). containerd keeps the one it found first for its life, so
// each is named: the one it runs is among them, even where another was
// installed since in a place it looks first. A file reached under two of
// those names is named once, under the first.
func (s containerdSide) shimPaths(name string) []string {
	var out []string
	if p := filepath.Join(s.cwd, name); isFile(p) {
		out = append(out, p)
	}
	for _, dir := range filepath.SplitList(s.path) {
		if p := filepath.Join(dir, name); filepath.IsAbs(dir) && isExecutable(p) {
			out = append(out, p)
		}
	}
	if p := filepath.Join(s.exeDir, name); isFile(p) {
		out = append(out, p)
	}
	// One file under several names (/bin a link to /usr/bin) is one part.
	seen := map[string]bool{}
	out = slices.DeleteFunc(out, func(p string) bool {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			real = p
		}
		dup := seen[real]
		seen[real] = true
		return dup
	})
	slices.Sort(out)
	return out
}

// lookPath finds name in containerd's PATH as Go's exec.LookPath does in
// the shim (which runs runc by its name): the first executable regular
// file. A relative entry is the shim's working directory (its bundle),
// which this engine fills: it is skipped.
func (s containerdSide) lookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(s.path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not in containerd's PATH (%s)", name, s.path)
}

func isFile(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
