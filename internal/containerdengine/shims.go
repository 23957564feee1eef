package containerdengine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A task create cut short can leave its runc shim running for good:
// containerd 1.6 starts the shim (its start command, then the shim
// itself), and if the create is cancelled meanwhile neither is undone.
// Such a shim may never have been connected to (its bundle directory is
// gone, and nothing of containerd knows it), or containerd may list its
// task, which no call can delete or kill without the container's record.
// This engine's own creates run to their end (createTask), so what is left
// comes from a process killed in one: the record is removed when the job
// is recovered, and the shim stays. EndOrphanedShims ends such shims.

// shimBinary is the runc shim's executable name (runsc runs under it too);
// shimComm is its name as the kernel keeps it (15 bytes).
const (
	shimBinary = "containerd-shim-runc-v2"
	shimComm   = "containerd-shim"
)

// shimProcess is a runc shim as its command line names it.
type shimProcess struct {
	pid       int
	namespace string
	id        string // the container's
	address   string // containerd's socket, in the shim's mount namespace
}

// parseShimCmdline reads a /proc/PID/cmdline: that of a running runc shim
// as containerd 1.6 starts it is its binary, then -namespace NS -id ID
// -address SOCKET, in any order, and maybe -debug. Anything else is not
// taken for one: the shim binary's start and delete commands (other
// flags, a positional argument), which exit by themselves and ignore
// SIGTERM, or any of the three flags missing, empty or given twice.
func parseShimCmdline(b []byte) (shimProcess, bool) {
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if len(args) < 7 || filepath.Base(args[0]) != shimBinary {
		return shimProcess{}, false
	}
	var p shimProcess
	seen := map[string]bool{}
	for i := 1; i < len(args); i++ {
		var dst *string
		switch args[i] {
		case "-namespace":
			dst = &p.namespace
		case "-id":
			dst = &p.id
		case "-address":
			dst = &p.address
		case "-debug":
			if seen["-debug"] {
				return shimProcess{}, false
			}
			seen["-debug"] = true
			continue
		default:
			return shimProcess{}, false
		}
		if seen[args[i]] || i+1 == len(args) || args[i+1] == "" {
			return shimProcess{}, false
		}
		seen[args[i]] = true
		i++
		*dst = args[i]
	}
	if p.namespace == "" || p.id == "" || p.address == "" {
		return shimProcess{}, false
	}
	return p, true
}

// engineID says whether id has the form of an ID newID gives: a name, a
// dot and 8 lowercase hex digits. A shim whose -id is anything else (a
// group of containers another client asked for) is never this engine's.
func engineID(id string) bool {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 || len(id)-i-1 != 8 {
		return false
	}
	for _, c := range id[i+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// shims lists the runc shims of this engine's containers: root processes
// named and running as the shim binary, of this engine's namespace, with
// an ID of this engine's form, whose socket is this engine's containerd's
// (the shim's -address resolved in its own mount namespace, compared as a
// file: /var/run and /run name the same one; a containerd nested in a
// container, at the same path, is another). Each comes with the command
// line it was taken for.
func (e *Engine) shims() (map[int][]byte, []shimProcess, error) {
	ours, err := os.Stat(e.cfg.Address)
	if err != nil {
		return nil, nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	lines := map[int][]byte{}
	var out []shimProcess
	var unseen []error
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid <= 1 {
			continue
		}
		// comm first: reading it does not take the process's memory
		// (a cmdline read does, and can wait on it).
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != shimComm {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		p, ok := parseShimCmdline(cmdline)
		if !ok || p.namespace != e.cfg.Namespace || !engineID(p.id) || !filepath.IsAbs(p.address) {
			continue
		}
		ok, err = isShimProcess(pid)
		if err == nil && ok {
			var fi os.FileInfo
			if fi, err = statIn(pid, p.address); err == nil {
				ok = os.SameFile(fi, ours)
			} else if errors.Is(err, os.ErrNotExist) {
				ok, err = false, nil // another containerd's socket, gone
			}
		}
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, os.ErrPermission) {
			// What a daemon without the host's view (no openat2, no
			// access to another process's root) meets: said, not skipped.
			unseen = append(unseen, fmt.Errorf("shim %q (pid %d) cannot be checked: %w", p.id, pid, err))
			continue
		}
		if err != nil || !ok {
			continue
		}
		p.pid = pid
		lines[pid] = cmdline
		out = append(out, p)
	}
	return lines, out, errors.Join(unseen...)
}

// isShimProcess says whether pid runs as root (its real uid, from its
// status) from an executable named as the shim binary (one replaced on
// disk since it started included), and has for at least shimMinAge: a
// shim that began its exit just before its container's record went
// (the container removed) is not taken for an orphan.
func isShimProcess(pid int) (bool, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false, err
	}
	uid := ""
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				uid = f[0]
			}
		}
	}
	if uid != "0" {
		return false, nil
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false, err
	}
	if filepath.Base(strings.TrimSuffix(exe, " (deleted)")) != shimBinary {
		return false, nil
	}
	age, err := processAge(pid)
	return err == nil && age >= shimMinAge, err
}

// shimMinAge is how long a shim must have run to be taken for an orphan.
const shimMinAge = 5 * time.Second

// processAge is how long pid has run (its start time in clock ticks
// since boot; Linux's are 100 per second).
func processAge(pid int) (time.Duration, error) {
	start, err := startTime(pid)
	if err != nil {
		return 0, err
	}
	ticks, err := strconv.ParseUint(start, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()) - time.Duration(ticks)*10*time.Millisecond, nil
}

// statIn stats path as process pid sees it: resolved under its root, every
// link too.
func statIn(pid int, path string) (os.FileInfo, error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(path, "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return f.Stat()
}

// shimGrace is how long an orphaned shim has to end after SIGTERM, and
// then after SIGKILL.
const shimGrace = 2 * time.Second

// EndOrphanedShims ends the runc shims of this engine's containers (see
// shims) whose container containerd no longer records, and returns the
// container IDs of those that ended. A task is only ever created for a
// recorded container, and an ID is never given twice, so such a shim
// serves nothing (one younger than shimMinAge is left for the next sweep:
// it may be a shim ending with its container's removal). It is sent
// SIGTERM (a shim that serves ends at once), and SIGKILL if it has not
// ended within shimGrace (a shim that has not reached its serving loop
// ignores SIGTERM); if containerd holds its connection, the shim's end
// lets containerd clean up after it, and a socket it leaves is removed
// (removeShimSocket). A shim that could not be checked (see shims) is
// an error, as is one that would not end. The
// shims are listed before the containers, so one started meanwhile is not
// looked at; each is signalled through a pidfd opened while its command
// line was still the one read, never a reused pid.
//
// It needs the host's processes in view (the daemon in the host's PID
// namespace, as root) and Linux 5.6 or later (pidfd_open, openat2).
func (e *Engine) EndOrphanedShims(ctx context.Context) ([]string, error) {
	lines, found, unseen := e.shims()
	if len(found) == 0 {
		return nil, unseen
	}
	cs, err := e.c.ContainerService().List(e.ns(ctx))
	if err != nil {
		return nil, err
	}
	recorded := make(map[string]bool, len(cs))
	for _, c := range cs {
		recorded[c.ID] = true
	}
	var (
		mu    sync.Mutex
		ended []string
		errs  []error
		wg    sync.WaitGroup
	)
	for _, p := range found {
		if recorded[p.id] {
			continue
		}
		wg.Go(func() {
			gone, err := endIfSame(p.pid, lines[p.pid])
			if gone {
				removeShimSocket(p)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("shim of %q (pid %d): %w", p.id, p.pid, err))
			}
			if gone {
				ended = append(ended, p.id)
			}
		})
	}
	wg.Wait()
	return ended, errors.Join(append(errs, unseen)...)
}

// endIfSame ends pid (SIGTERM, then SIGKILL after shimGrace) if its
// command line is still cmdline, and says whether it ended. The pidfd is
// opened before the check, so the process checked is the one signalled.
// A process gone before the check, or another one now, is neither ended
// nor an error.
func endIfSame(pid int, cmdline []byte) (bool, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	now, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Equal(now, cmdline) {
		return false, nil // gone, or another process now
	}
	if ok, err := isShimProcess(pid); err != nil || !ok {
		return false, nil
	}
	for i, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); errors.Is(err, unix.ESRCH) {
			return i > 0, nil // ended by itself before the first: not this sweep's
		} else if err != nil {
			return false, err
		}
		if exited(fd, shimGrace) {
			return true, nil
		}
	}
	return false, fmt.Errorf("still running %v after SIGKILL", shimGrace)
}

// exited waits up to d for the process of pidfd fd to exit.
func exited(fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
	}
}

// shimSocketDir is where containerd 1.6's runc shims listen (a constant
// of containerd's, whatever its state directory).
const shimSocketDir = "/run/containerd/s"

// removeShimSocket removes the socket an ended shim leaves when it could
// not remove it itself (its bundle gone, or killed): containerd 1.6 names
// it by the SHA-256 of its address, namespace and ID joined as a path
// (runtime/v2/shim.SocketAddress). Only a socket nothing listens on any
// more is removed.
func removeShimSocket(p shimProcess) {
	sum := sha256.Sum256([]byte(filepath.Join(p.address, p.namespace, p.id)))
	path := filepath.Join(shimSocketDir, hex.EncodeToString(sum[:]))
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		return
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(path)
	}
}
