package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// result is what a bomb reports: how far it got and the errno that
// stopped it.
type result struct {
	Count int    `json:"count"`
	Errno string `json:"errno"`
}

func errno(err error) string {
	if en, ok := err.(syscall.Errno); ok {
		return unix.ErrnoName(en)
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// forkBomb starts single-threaded /bin/sleep children until fork fails
// (at most 100000); the helper kills them when the command ends.
func forkBomb() result {
	var r result
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	for r.Count < 100000 {
		_, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "600"}, attr)
		if err != nil {
			r.Errno = errno(err)
			return r
		}
		r.Count++
	}
	return r
}

// fdBomb opens /dev/null until open fails (at most 10^6 times).
func fdBomb() result {
	var r result
	for r.Count < 1_000_000 {
		if _, err := unix.Open("/dev/null", unix.O_RDONLY, 0); err != nil {
			r.Errno = errno(err)
			return r
		}
		r.Count++
	}
	return r
}

// zombies leaves n exited children unreaped and reports how many zombies
// of this process it saw.
func zombies(n int) result {
	var r result
	attr := &syscall.ProcAttr{}
	for i := 0; i < n; i++ {
		if _, err := syscall.ForkExec("/bin/true", []string{"true"}, attr); err != nil {
			r.Errno = errno(err)
			break
		}
	}
	me := strconv.Itoa(os.Getpid())
	for try := 0; try < 50; try++ {
		r.Count = 0
		pids, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, p := range pids {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...
			s := string(b)
			i := strings.LastIndexByte(s, ')')
			if i < 0 {
				continue
			}
			f := strings.Fields(s[i+1:])
			if len(f) > 1 && f[0] == "Z" && f[1] == me {
				r.Count++
			}
		}
		if r.Count >= n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

// files creates n empty files in dir. It opens dir once and creates each
// file relative to it: a path from / would be walked again for every file,
// and on a FUSE root filesystem (fuse-overlayfs here) each walk by a
// non-root uid asks the FUSE daemon for /'s ACL, a round trip per file
// (35 s for a million idle, past two minutes under CI's load).
func files(n int, dir string) result {
	var r result
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		r.Errno = errno(err)
		return r
	}
	defer unix.Close(dfd)
	for r.Count < n {
		fd, err := unix.Openat(dfd, fmt.Sprintf("f%07d", r.Count), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		if err != nil {
			r.Errno = errno(err)
			return r
		}
		unix.Close(fd)
		r.Count++
	}
	return r
}
