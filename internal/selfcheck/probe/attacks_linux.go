package probe

import (
	"errors"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// errnoName names an error's errno, "" for nil, or the error text.
func errnoName(err error) string {
	if err == nil {
		return ""
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		if en == 0 {
			return ""
		}
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
		return "errno " + en.Error()
	}
	return err.Error()
}

func sys(trap uintptr, a ...uintptr) (uintptr, error) {
	var args [6]uintptr
	copy(args[:], a)
	r, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return r, e
	}
	return r, nil
}

// closeOnSuccess closes a returned descriptor when the call succeeded.
func closeOnSuccess(fd uintptr, err error) error {
	if err == nil {
		unix.Close(int(fd))
	}
	return err
}

func cstr(s string) uintptr {
	p, _ := unix.BytePtrFromString(s)
	return uintptr(unsafe.Pointer(p))
}

// Syscall is one denied syscall and a harmless way to call it.
type Syscall struct {
	Name string
	// Want is the errno the sandbox's profile answers with.
	Want string
	Try  func() error
}

// Syscalls lists every syscall the profile denies that exists on this
// architecture, each with an attempt that is harmless even where allowed:
// the attempt's arguments are chosen so that, where it can, an allowed call
// ends in a different errno (or success) than the profile's EPERM.
func Syscalls() []Syscall {
	return []Syscall{
		{"ptrace", "EPERM", func() error {
			_, err := sys(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1)
			if err == nil {
				sys(unix.SYS_PTRACE, unix.PTRACE_DETACH, 1)
			}
			return err
		}},
		{"process_vm_readv", "EPERM", func() error {
			var b [1]byte
			local := unix.Iovec{Base: &b[0], Len: 1}
			remote := unix.RemoteIovec{Base: 0, Len: 1}
			_, err := sys(unix.SYS_PROCESS_VM_READV, 1, uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
			return err
		}},
		{"process_vm_writev", "EPERM", func() error {
			var b [1]byte
			local := unix.Iovec{Base: &b[0], Len: 1}
			remote := unix.RemoteIovec{Base: 0, Len: 1}
			_, err := sys(unix.SYS_PROCESS_VM_WRITEV, 1, uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
			return err
		}},
		{"process_madvise", "EPERM", func() error { _, err := sys(unix.SYS_PROCESS_MADVISE, ^uintptr(0), 0, 0, 0, 0); return err }},
		{"kcmp", "EPERM", func() error {
			p := uintptr(os.Getpid())
			_, err := sys(unix.SYS_KCMP, p, p, 0 /* KCMP_FILE */, 0, 0)
			return err
		}},
		{"pidfd_getfd", "EPERM", func() error { _, err := sys(unix.SYS_PIDFD_GETFD, ^uintptr(0), 0, 0); return err }},
		{"personality", "EPERM", func() error { _, err := sys(unix.SYS_PERSONALITY, 0xffffffff); return err }},
		{"userfaultfd", "EPERM", func() error { return closeOnSuccess(sys(unix.SYS_USERFAULTFD, unix.O_CLOEXEC)) }},
		{"bpf", "EPERM", func() error {
			// BPF_MAP_CREATE of a 1-entry array map.
			attr := [8]uint32{2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 1}
			return closeOnSuccess(sys(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr)))
		}},
		{"perf_event_open", "EPERM", func() error {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
			attr.Bits = unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv
			return closeOnSuccess(sys(unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(&attr)), 0, ^uintptr(0), ^uintptr(0), 0))
		}},
		{"lookup_dcookie", "EPERM", func() error { _, err := sys(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0); return err }},
		{"keyctl", "EPERM", func() error {
			_, err := sys(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd) /* session */, 0)
			return err
		}},
		{"add_key", "EPERM", func() error {
			_, err := sys(unix.SYS_ADD_KEY, cstr("user"), cstr("sandboxd-probe"), cstr("x"), 1, uintptr(0xfffffffe) /* process keyring */)
			return err
		}},
		{"request_key", "EPERM", func() error {
			_, err := sys(unix.SYS_REQUEST_KEY, cstr("user"), cstr("sandboxd-probe-absent"), 0, 0)
			return err
		}},
		{"io_uring_setup", "EPERM", func() error {
			var params [120]byte
			return closeOnSuccess(sys(unix.SYS_IO_URING_SETUP, 8, uintptr(unsafe.Pointer(&params))))
		}},
		{"io_uring_enter", "EPERM", func() error { _, err := sys(unix.SYS_IO_URING_ENTER, ^uintptr(0), 0, 0, 0, 0, 0); return err }},
		{"io_uring_register", "EPERM", func() error { _, err := sys(unix.SYS_IO_URING_REGISTER, ^uintptr(0), 0, 0, 0); return err }},
		{"unshare", "EPERM", func() error {
			return onLockedThread(func() error { _, err := sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER); return err })
		}},
		{"setns", "EPERM", func() error {
			fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return onLockedThread(func() error { _, err := sys(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWNET); return err })
		}},
		{"clone3", "ENOSYS", func() error { _, err := sys(unix.SYS_CLONE3, 0, 0); return err }},
		{"chroot", "EPERM", func() error { _, err := sys(unix.SYS_CHROOT, cstr("/nonexistent-sandboxd-probe")); return err }},
		{"mount", "EPERM", tryMount},
		{"umount2", "EPERM", func() error { _, err := sys(unix.SYS_UMOUNT2, cstr("/nonexistent-sandboxd-probe"), 0); return err }},
		{"pivot_root", "EPERM", func() error {
			_, err := sys(unix.SYS_PIVOT_ROOT, cstr("/nonexistent-sandboxd-probe"), cstr("/nonexistent-sandboxd-probe"))
			return err
		}},
		{"fsopen", "EPERM", func() error { return closeOnSuccess(sys(unix.SYS_FSOPEN, cstr("tmpfs"), unix.FSOPEN_CLOEXEC)) }},
		{"fsconfig", "EPERM", func() error { _, err := sys(unix.SYS_FSCONFIG, ^uintptr(0), 0, 0, 0, 0); return err }},
		{"fsmount", "EPERM", func() error { _, err := sys(unix.SYS_FSMOUNT, ^uintptr(0), 0, 0); return err }},
		{"fspick", "EPERM", func() error {
			return closeOnSuccess(sys(unix.SYS_FSPICK, uintptr(atFDCWD), cstr("/"), unix.FSPICK_CLOEXEC))
		}},
		{"move_mount", "EPERM", func() error {
			_, err := sys(unix.SYS_MOVE_MOUNT, ^uintptr(0), cstr(""), ^uintptr(0), cstr(""), 0)
			return err
		}},
		{"open_tree", "EPERM", func() error {
			return closeOnSuccess(sys(unix.SYS_OPEN_TREE, uintptr(atFDCWD), cstr("/"), unix.OPEN_TREE_CLOEXEC))
		}},
		{"mount_setattr", "EPERM", func() error { _, err := sys(unix.SYS_MOUNT_SETATTR, ^uintptr(0), cstr(""), 0, 0, 0); return err }},
		{"name_to_handle_at", "EPERM", func() error {
			_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
			return err
		}},
		{"open_by_handle_at", "EPERM", func() error {
			// The "Shocker" escape: a handle for the root of the mount,
			// opened through a descriptor of the container's root.
			h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
			fd, err := unix.Open("/", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			nfd, err := unix.OpenByHandleAt(fd, h, unix.O_RDONLY)
			if err == nil {
				unix.Close(nfd)
			}
			return err
		}},
		{"fanotify_init", "EPERM", func() error { return closeOnSuccess(sys(unix.SYS_FANOTIFY_INIT, 0, 0)) }},
		{"syslog", "EPERM", func() error { _, err := sys(unix.SYS_SYSLOG, 10 /* SIZE_BUFFER */, 0, 0); return err }},
		{"acct", "EPERM", func() error { _, err := sys(unix.SYS_ACCT, cstr("/nonexistent-sandboxd-probe")); return err }},
		{"quotactl", "EPERM", func() error {
			_, err := sys(unix.SYS_QUOTACTL, 0x800004 /* Q_GETFMT */, cstr("/nonexistent-sandboxd-probe"), 0, 0)
			return err
		}},
		{"quotactl_fd", "EPERM", func() error { _, err := sys(unix.SYS_QUOTACTL_FD, ^uintptr(0), 0, 0, 0); return err }},
		{"vmsplice", "EPERM", func() error { _, err := sys(unix.SYS_VMSPLICE, ^uintptr(0), 0, 0, 0); return err }},
		{"mbind", "EPERM", func() error { _, err := sys(unix.SYS_MBIND, 0, 0, 0, 0, 0, 0); return err }},
		{"set_mempolicy", "EPERM", func() error { _, err := sys(unix.SYS_SET_MEMPOLICY, 0, 0, 0); return err }},
		{"set_mempolicy_home_node", "EPERM", func() error { _, err := sys(unix.SYS_SET_MEMPOLICY_HOME_NODE, 0, 0, 0, 0); return err }},
		{"get_mempolicy", "EPERM", func() error { _, err := sys(unix.SYS_GET_MEMPOLICY, 0, 0, 0, 0, 0); return err }},
		{"move_pages", "EPERM", func() error { _, err := sys(unix.SYS_MOVE_PAGES, 0, 0, 0, 0, 0, 0); return err }},
		{"migrate_pages", "EPERM", func() error { _, err := sys(unix.SYS_MIGRATE_PAGES, 0, 0, 0, 0); return err }},
		{"kexec_load", "EPERM", func() error { _, err := sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0); return err }},
		{"kexec_file_load", "EPERM", func() error { _, err := sys(unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0); return err }},
		{"init_module", "EPERM", func() error { _, err := sys(unix.SYS_INIT_MODULE, 0, 0, cstr("")); return err }},
		{"finit_module", "EPERM", func() error { _, err := sys(unix.SYS_FINIT_MODULE, ^uintptr(0), cstr(""), 0); return err }},
		{"delete_module", "EPERM", func() error {
			_, err := sys(unix.SYS_DELETE_MODULE, cstr("sandboxd_probe_absent"), unix.O_NONBLOCK)
			return err
		}},
		{"reboot", "EPERM", func() error { _, err := sys(unix.SYS_REBOOT, 0, 0, 0, 0); return err }},
		{"swapon", "EPERM", func() error { _, err := sys(unix.SYS_SWAPON, cstr("/nonexistent-sandboxd-probe"), 0); return err }},
		{"swapoff", "EPERM", func() error { _, err := sys(unix.SYS_SWAPOFF, cstr("/nonexistent-sandboxd-probe")); return err }},
		{"iopl", "EPERM", func() error { _, err := sys(unix.SYS_IOPL, 0); return err }},
		{"ioperm", "EPERM", func() error { _, err := sys(unix.SYS_IOPERM, 0, 0, 0); return err }},
		{"settimeofday", "EPERM", func() error { _, err := sys(unix.SYS_SETTIMEOFDAY, 0, 0); return err }},
		{"clock_settime", "EPERM", func() error { _, err := sys(unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, 0); return err }},
		{"adjtimex", "EPERM", func() error {
			var tx unix.Timex // modes 0: a read-only query where allowed
			_, err := sys(unix.SYS_ADJTIMEX, uintptr(unsafe.Pointer(&tx)))
			return err
		}},
		{"clock_adjtime", "EPERM", func() error {
			var tx unix.Timex
			_, err := sys(unix.SYS_CLOCK_ADJTIME, unix.CLOCK_REALTIME, uintptr(unsafe.Pointer(&tx)))
			return err
		}},
	}
}

// tryMount mounts a small tmpfs over a fresh directory (and unmounts it
// again where that was allowed).
func tryMount() error {
	dir, err := os.MkdirTemp("", "sandboxd-probe-mnt")
	if err != nil {
		dir = "/nonexistent-sandboxd-probe"
	} else {
		defer os.Remove(dir)
	}
	_, err = sys(unix.SYS_MOUNT, cstr("none"), cstr(dir), cstr("tmpfs"), 0, cstr("size=64k"))
	if err == nil {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
	return err
}

// onLockedThread runs f on a thread that is thrown away afterwards, so
// that a namespace change where allowed never leaks into the runtime.
func onLockedThread(f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		ch <- f()
	}()
	return <-ch
}

// Socket is one socket(2) a candidate must not get.
type Socket struct {
	Name                   string
	Family, Type, Protocol int
}

// Sockets lists the sockets that must fail: families outside the profile's
// allowlist (vsock, AF_ALG) and raw sockets, which need CAP_NET_RAW.
func Sockets() []Socket {
	return []Socket{
		{"AF_VSOCK", unix.AF_VSOCK, unix.SOCK_STREAM, 0},
		{"AF_ALG", unix.AF_ALG, unix.SOCK_SEQPACKET, 0},
		{"AF_PACKET/raw", unix.AF_PACKET, unix.SOCK_RAW, 0x0300 /* htons(ETH_P_ALL) */},
		{"AF_INET/raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
		{"AF_INET6/raw", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6},
	}
}

// Try creates the socket and closes it at once.
func (s Socket) Try() error {
	fd, err := unix.Socket(s.Family, s.Type|unix.SOCK_CLOEXEC, s.Protocol)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// RunSyscalls tries the named syscalls (all when names is empty).
func RunSyscalls(names ...string) []Attempt {
	var out []Attempt
	for _, s := range Syscalls() {
		if len(names) > 0 && !contains(names, s.Name) {
			continue
		}
		out = append(out, Attempt{Name: s.Name, Errno: errnoName(s.Try())})
	}
	return out
}

// RunSockets tries the named sockets (all when names is empty).
func RunSockets(names ...string) []Attempt {
	var out []Attempt
	for _, s := range Sockets() {
		if len(names) > 0 && !contains(names, s.Name) {
			continue
		}
		out = append(out, Attempt{Name: s.Name, Errno: errnoName(s.Try())})
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// atFDCWD is AT_FDCWD as a variable, so that it converts to uintptr.
var atFDCWD = unix.AT_FDCWD
