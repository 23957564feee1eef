package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockState takes the state directory for this process: one daemon (or
// `sandboxd gc`) at a time may use a journal and a blob store. The lock is
// an flock on DIR/lock, released by the kernel when the process dies; the
// file holds the pid of the process that has it, so that the next one can
// say who holds it. unlock releases it.
func LockState(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state %s: %w", dir, err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state %s: lock: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state %s is in use by %s (it holds %s); stop it, or give this one another --state", dir, holder(f), path)
		}
		return nil, fmt.Errorf("state %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("state %s: write pid to %s: %w", dir, path, err)
	}
	return func() { f.Close() }, nil
}

// holder names the process whose pid the lock file holds, with its
// command line when /proc shows it.
func holder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return "another process (its pid is not written yet)"
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(cmd) == 0 {
		return fmt.Sprintf("pid %d", pid)
	}
	args := strings.Fields(strings.ReplaceAll(string(cmd), "\x00", " "))
	if len(args) > 3 {
		args = append(args[:3], "…")
	}
	return fmt.Sprintf("pid %d (%s)", pid, strings.Join(args, " "))
}
