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
	"syscall"

	"golang.org/x/sys/unix"
)

// A process killed while containerd 1.6 created its container's task can
// leave that task's runc shim running for good: containerd started the
// shim, the create was cancelled before containerd recorded the task, and
// no API call reaches the shim again (containerd's task list does not
// name it, and deleting the container does not end it). Its bundle
// directory stays with it. EndOrphanedShims ends such shims.

// shimBinary is the runc shim's executable name (runsc runs under it too).
const shimBinary = "containerd-shim-runc-v2"

// shimProcess is a runc shim as its command line names it.
type shimProcess struct {
	pid       int
	namespace string
	id        string // the container's
	address   string // containerd's socket
}

// parseShimCmdline reads a /proc/PID/cmdline: a runc shim's is its binary
// then -namespace NS -id ID -address SOCKET (as containerd 1.6 starts it;
// other flags, such as -debug, may come between them). Anything else, or
// any of the three missing or given twice, is not a shim of ours.
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
		default:
			continue
		}
		if seen[args[i]] || i+1 == len(args) {
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

// shims lists the runc shims, run by root, of this engine's namespace on
// its containerd (the shim's socket is the engine's, compared as files:
// /var/run and /run name the same one), with the command line each was
// read from.
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
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(shimBinary)) {
			continue
		}
		p, ok := parseShimCmdline(cmdline)
		if !ok || p.namespace != e.cfg.Namespace {
			continue
		}
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			continue
		}
		if fi, err := os.Stat(p.address); err != nil || !os.SameFile(fi, ours) {
			continue
		}
		p.pid = pid
		lines[pid] = cmdline
		out = append(out, p)
	}
	return lines, out, nil
}

// EndOrphanedShims ends (SIGTERM) the runc shims of this engine's
// namespace whose container containerd no longer has, and returns their
// container IDs. Such a shim serves nothing: a task is only ever created
// for a recorded container, so a shim that outlived its container's
// record is one whose task create was cut short (see above) — ended, it
// lets containerd remove its bundle. The shims are listed before the
// containers, so a shim started meanwhile is not looked at; each is
// signalled through a pidfd opened while its command line was still the
// one read, never a reused pid.
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
	var ended []string
	var errs []error
	for _, p := range found {
		if recorded[p.id] {
			continue
		}
		if err := signalIfSame(p.pid, lines[p.pid], unix.SIGTERM); err != nil {
			errs = append(errs, fmt.Errorf("shim of %s (pid %d): %w", p.id, p.pid, err))
			continue
		}
		ended = append(ended, p.id)
	}
	return ended, errors.Join(errs...)
}

// signalIfSame signals pid if its command line is still cmdline: the
// pidfd is opened first, so the process checked is the one signalled. A
// process gone meanwhile is not an error.
func signalIfSame(pid int, cmdline []byte, sig unix.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	now, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Equal(now, cmdline) {
		return nil // gone, or another process now
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}
