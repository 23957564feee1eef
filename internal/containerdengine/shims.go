package containerdengine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
		if !isShimProcess(pid) {
			continue
		}
		if fi, err := statIn(pid, p.address); err != nil || !os.SameFile(fi, ours) {
			continue
		}
		p.pid = pid
		lines[pid] = cmdline
		out = append(out, p)
	}
	return lines, out, nil
}

// isShimProcess says whether pid runs as root from an executable named as
// the shim binary (one replaced on disk since it started included).
func isShimProcess(pid int) bool {
	fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		return false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == shimBinary
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
// serves nothing. It is sent SIGTERM (a shim that serves ends at once and
// removes its socket), and SIGKILL if it has not ended within shimGrace (a
// shim still opening its log ignores SIGTERM); if containerd holds its
// connection, the shim's end lets containerd clean up after it. The
// shims are listed before the containers, so one started meanwhile is not
// looked at; each is signalled through a pidfd opened while its command
// line was still the one read, never a reused pid.
//
// It needs the host's processes in view (the daemon in the host's PID
// namespace, as root) and Linux 5.6 or later (pidfd_open, openat2).
func (e *Engine) EndOrphanedShims(ctx context.Context) ([]string, error) {
	lines, found, err := e.shims()
	if err != nil || len(found) == 0 {
		return nil, err
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
	return ended, errors.Join(errs...)
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
	if err != nil || !bytes.Equal(now, cmdline) || !isShimProcess(pid) {
		return false, nil // gone, or another process now
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); errors.Is(err, unix.ESRCH) {
			return true, nil
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
		return err == nil && n > 0
	}
}
