package helper

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// denyClone3 stacks a seccomp filter on every thread of the helper, and so
// on everything it starts, that answers clone3 with ENOSYS and leaves every
// other system call to the filters already installed.
//
// The sandbox's profile already answers clone3 with ENOSYS (its flags are
// behind a pointer seccomp cannot read, so the namespace rules on clone
// would not apply to it; ENOSYS, not EPERM, is what makes glibc fall back
// to clone). runc installs the profile as written, and there this filter
// changes nothing. gVisor's runsc --oci-seccomp answers every errno rule
// with EPERM (runsc/specutils/seccomp: "runc always returns EPERM"), and on
// EPERM glibc 2.34+ fails pthread_create instead of falling back. Of two
// filters that both answer with an errno, the kernel (and gVisor's sentry)
// takes the one installed last: this one. A candidate cannot remove a
// filter, only add its own.
func denyClone3() error {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return fmt.Errorf("deny clone3: no audit arch for %s", runtime.GOARCH)
	}
	const (
		offNr   = 0 // struct seccomp_data: nr, then arch
		offArch = 4
	)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: offArch},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: arch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: offNr},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_CLONE3},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// no_new_privs is the container's (the runtime sets it); without it
	// the kernel refuses a filter from a process lacking CAP_SYS_ADMIN.
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	return seccompInstalled(r, errno)
}

// seccompInstalled reads a TSYNC filter install's answer: an errno, or
// (with errno 0) the id of a thread that could not be synchronised, in
// which case no filter was installed at all.
func seccompInstalled(r uintptr, errno unix.Errno) error {
	if errno != 0 {
		return fmt.Errorf("deny clone3: seccomp: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("deny clone3: seccomp: thread %d could not be synchronised: no filter installed", r)
	}
	return nil
}

// auditArch is the AUDIT_ARCH of each architecture the helper is built for.
var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}
