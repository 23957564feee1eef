package helper

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// asUID runs fn on one thread of the helper whose effective uid is uid for
// the call, then makes the thread root again. Credentials are a thread's
// own on Linux (the raw setresuid changes only the calling thread; Go's
// syscall.Setuid would change them all), and kill(2) lets a sender whose
// real or effective uid is a target's real or saved uid signal it: from
// that thread, kill reaches uid's processes. The thread's real and saved
// uid stay root, so no process of uid may signal the helper meanwhile (a
// target's real and saved uid are what a sender must match).
//
// It needs no new process or thread: a candidate that fills its pids
// cgroup (a fork bomb) cannot keep the helper from killing it, as it did
// when the kill went through a child that needed a free pid.
func asUID(uid int, fn func()) error { return asIDs(uid, keepID, fn) }

// keepID, as asIDs's gid: the thread's gid stays root's.
const keepID = -1

// asIDs is asUID with the thread's effective gid (and so its file system
// gid) gid too, unless gid is keepID: for what the candidate may list
// through its group (/tmp is root's, writable and listable by the
// candidate's group alone). fn runs on a goroutine of its own, locked to
// its thread, and waited for: a thread that could not take root's ids
// back ends with that goroutine and never runs anything else of the
// helper's. The gid is taken first and given back last, while the thread
// is root (its capabilities are dropped while its effective uid is not).
func asIDs(uid, gid int, fn func()) error {
	if uid <= 0 {
		return fmt.Errorf("act as uid %d: not a candidate uid", uid)
	}
	if gid == 0 || gid < keepID {
		return fmt.Errorf("act as gid %d: not a candidate gid", gid)
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := onThreadAs(uid, gid, fn)
		if back {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// onThreadAs takes uid (and gid, unless keepID) as the calling thread's
// effective ids, runs fn, and takes root's back. back: the thread is root
// again (or never left it).
func onThreadAs(uid, gid int, fn func()) (back bool, err error) {
	keep := uintptr(^uint32(0)) // -1: leave this id as it is
	if gid != keepID {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
			return true, fmt.Errorf("take gid %d on a thread: %w", gid, e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		err = fmt.Errorf("take uid %d on a thread: %w", uid, e)
	} else {
		fn()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return false, fmt.Errorf("return to root from uid %d: %w", uid, e)
		}
	}
	if gid != keepID {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep); e != 0 {
			return false, fmt.Errorf("return to gid 0 from gid %d: %w", gid, e)
		}
	}
	return true, err
}

// killAllOf sends SIGKILL to every process of uid in the sandbox's pid
// namespace. From a thread whose real uid stays root, kill(-1) also
// reaches root's processes (all but init and the caller): it is used only
// while none else is there, which holds in a sandbox (the candidate cannot
// become root, and the helper starts no root child), and is checked each
// time. kill(-1) is one walk of the process list under the lock that fork
// takes to attach a child, so no child of a bomb slips past it. Otherwise
// each process of uid is killed by its pid.
func killAllOf(uid int) error {
	if uid <= 0 {
		return fmt.Errorf("kill as uid %d: not a candidate uid", uid)
	}
	solo, err := onlyRootIsInitAndMe()
	if err != nil {
		return err
	}
	return asUID(uid, func() {
		if solo {
			for range 3 {
				unix.Kill(-1, unix.SIGKILL)
			}
			return
		}
		for _, pid := range pidsOf(uid) {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
}

// onlyRootIsInitAndMe reports whether no process but pid 1 and the helper
// itself has root as its real, effective or saved uid.
func onlyRootIsInitAndMe() (bool, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false, fmt.Errorf("list processes: %w", err)
	}
	me := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == me {
			continue
		}
		uids, err := statusUIDs(pid)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue // it ended (ESRCH: reaped, its entry still open)
		}
		if err != nil || uids[0] == 0 || uids[1] == 0 || uids[2] == 0 {
			return false, nil
		}
	}
	return true, nil
}

// pidsOf lists the processes whose real uid is uid.
func pidsOf(uid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if uids, err := statusUIDs(pid); err == nil && uids[0] == uid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// statusUIDs reads a process's real, effective, saved and filesystem uids.
func statusUIDs(pid int) ([4]int, error) {
	var uids [4]int
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return uids, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 4 {
			break
		}
		for i := range uids {
			if uids[i], err = strconv.Atoi(f[i]); err != nil {
				return uids, fmt.Errorf("process %d: Uid line %q", pid, v)
			}
		}
		return uids, nil
	}
	return uids, fmt.Errorf("process %d: no Uid line", pid)
}
