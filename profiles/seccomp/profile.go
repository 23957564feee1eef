package seccomp

//go:generate go run ./internal/gen -o sandboxd.json

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

//go:embed sandboxd.json
var profileJSON []byte

// JSON returns the profile as checked in (a copy).
func JSON() []byte { return bytes.Clone(profileJSON) }

// Digest returns the sha256 digest of the checked-in profile, as recorded
// in every Result.
func Digest() string { return digestOf(profileJSON) }

// Denied are the syscalls removed from the upstream default. Every one of
// them fails with EPERM (the profile's default action), except those in
// NotImplemented, which fail with ENOSYS so that libc falls back.
var Denied = []string{
	// Debugging and reading other processes.
	"ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
	"personality",
	// Kernel attack surface rarely needed by tests.
	"userfaultfd", "bpf", "perf_event_open", "lookup_dcookie",
	"keyctl", "add_key", "request_key",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// Namespaces and mounts.
	"unshare", "setns", "clone3", "chroot",
	"mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
	"move_mount", "open_tree", "mount_setattr",
	// File handles (the "Shocker" escape).
	"name_to_handle_at", "open_by_handle_at",
	// Host-wide state.
	"fanotify_init", "syslog", "acct", "quotactl", "quotactl_fd", "vmsplice",
	"mbind", "set_mempolicy", "set_mempolicy_home_node", "get_mempolicy", "move_pages", "migrate_pages",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"reboot", "swapon", "swapoff", "iopl", "ioperm",
	"settimeofday", "stime", "clock_settime", "clock_settime64", "adjtimex", "clock_adjtime", "clock_adjtime64",
}

// NotImplemented are denied with ENOSYS instead of EPERM.
var NotImplemented = []string{"clone3"}

// Generate builds the profile from the upstream default.
func Generate() ([]byte, error) {
	p := moby.DefaultProfile()
	var kept []*moby.Syscall
	for _, rule := range p.Syscalls {
		if rule.Action != specs.ActAllow {
			// Upstream's non-allow rules (clone3 → ENOSYS) are replaced below.
			continue
		}
		names := slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool {
			return slices.Contains(Denied, n)
		})
		if len(names) == 0 {
			continue
		}
		// Rules that only apply when the container holds an extra capability
		// are dropped: sandboxes never grant those capabilities, and keeping
		// them would loosen the profile the day one is granted.
		if rule.Includes != nil && len(rule.Includes.Caps) > 0 {
			continue
		}
		r := *rule
		r.Names = names
		kept = append(kept, &r)
	}
	enosys := uint(38)
	kept = append(kept, &moby.Syscall{LinuxSyscall: specs.LinuxSyscall{
		Names:    slices.Clone(NotImplemented),
		Action:   specs.ActErrno,
		ErrnoRet: &enosys,
	}})
	p.Syscalls = kept
	// Only the host's native ABI: upstream also names its compatibility
	// ABIs (x86 and x32 on x86_64, arm on aarch64, …), each another syscall
	// table and entry path into the kernel that a sandbox does not need.
	// A syscall through an ABI the filter does not name kills its thread.
	// (It also makes the filter a third of the size for runc to build at
	// every container's start.)
	for i := range p.ArchMap {
		p.ArchMap[i].SubArches = nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "\t")
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("encode seccomp profile: %w", err)
	}
	return buf.Bytes(), nil
}
