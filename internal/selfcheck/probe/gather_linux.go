package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Options say what the probe aims at besides its fixed list.
type Options struct {
	// Connect is a host:port to dial over TCP (a listener on the host's
	// loopback that the sandbox must not reach). Empty: no attempt.
	Connect string
	// Resolve is a name to look up. Empty: no attempt.
	Resolve string
	// ReadOnly are directories in which creating a file must fail (the
	// bundle, read-only inputs).
	ReadOnly []string
}

// MaskedPaths are the paths the engine masks by default (moby's
// oci.DefaultSpec): files read as empty, directories list as empty.
var MaskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
}

// ProcSysWrites are files that must not open for writing.
var ProcSysWrites = []string{
	"/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger",
}

// OpenFDs lists the process's open descriptors and what they point at.
func OpenFDs() map[string]string {
	out := map[string]string{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the descriptor ReadDir itself used
		}
		out[e.Name()] = t
	}
	return out
}

// Gather runs every check and returns the report. fds are the descriptors
// the process had at start (see OpenFDs).
func Gather(opts Options, fds map[string]string) Report {
	r := Report{Schema: Schema, UID: os.Getuid(), GID: os.Getgid(), FDs: fds}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	r.Hostname, _ = os.Hostname()
	r.Status = statusFields()
	r.Syscalls = RunSyscalls()
	r.Sockets = RunSockets()
	r.Reads = reads()
	r.Writes = writes(opts.ReadOnly)
	var fs unix.Statfs_t
	if unix.Statfs("/", &fs) == nil {
		r.RootReadOnly = fs.Flags&unix.ST_RDONLY != 0
	}
	r.Interfaces = interfaces()
	if opts.Connect != "" {
		r.Connect = connect(opts.Connect)
	}
	if opts.Resolve != "" {
		r.Resolve = resolve(opts.Resolve)
	}
	r.Env = os.Environ()
	sort.Strings(r.Env)
	r.Mountinfo = lines("/proc/self/mountinfo")
	r.Cgroup = lines("/proc/self/cgroup")
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		r.ResolvConf = string(b)
	}
	r.DevShm = Attempt{Name: "/dev/shm", Errno: errnoName(create("/dev/shm"))}
	abi := TryForeignABI("/proc/self/exe", ABIChildArg)
	r.ForeignABI = &abi
	r.Namespaces = map[string]string{}
	for _, ns := range []string{"cgroup", "ipc", "mnt", "net", "pid", "user", "uts"} {
		t, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t = "error: " + errnoName(err)
		}
		r.Namespaces[ns] = t
	}
	r.UIDMap, r.GIDMap = fieldLines("/proc/self/uid_map"), fieldLines("/proc/self/gid_map")
	if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
		r.OOMScoreAdj = strings.TrimSpace(string(b))
	}
	r.Rlimits = rlimits()
	r.CgroupLimits = map[string]string{}
	for _, f := range cgroupLimitFiles {
		if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", f)); err == nil {
			r.CgroupLimits[f] = strings.TrimSpace(string(b))
		}
	}
	if b, err := os.ReadFile("/proc/1/comm"); err == nil {
		r.Init = strings.TrimSpace(string(b))
	}
	return r
}

// cgroupLimitFiles are the limits of cgroup v1 and v2 the engine sets for
// memory, swap, CPU and pids; those of the other version are absent.
var cgroupLimitFiles = []string{
	"memory/memory.limit_in_bytes", "memory/memory.memsw.limit_in_bytes",
	"cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us", "pids/pids.max",
	"memory.max", "memory.swap.max", "cpu.max", "pids.max",
}

// fieldLines returns a file's lines with runs of blanks as one space.
func fieldLines(path string) []string {
	out := lines(path)
	for i, l := range out {
		out[i] = strings.Join(strings.Fields(l), " ")
	}
	return out
}

// rlimits parses /proc/self/limits: "Max open files  1024  1024  files".
func rlimits() map[string]string {
	out := map[string]string{}
	ls := lines("/proc/self/limits")
	if len(ls) > 0 {
		ls = ls[1:] // the header
	}
	for _, l := range ls {
		if len(l) < 26 {
			continue
		}
		f := strings.Fields(l[25:])
		if len(f) >= 2 {
			out[strings.TrimSpace(l[:25])] = f[0] + " " + f[1]
		}
	}
	return out
}

func statusFields() map[string]string {
	out := map[string]string{}
	for _, l := range lines("/proc/self/status") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch k {
		case "Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp":
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

func lines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func reads() []FileRead {
	var out []FileRead
	paths := append([]string{}, MaskedPaths...)
	// Other processes' environments: the helper and init run as root.
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		if pid, _ := strconv.Atoi(filepath.Base(p)); pid != os.Getpid() && ownerOf(p) != os.Getuid() {
			paths = append(paths, p+"/environ")
		}
	}
	for _, p := range paths {
		out = append(out, readFile(p))
	}
	return out
}

func ownerOf(path string) int {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return -1
	}
	return int(st.Uid)
}

func readFile(p string) FileRead {
	fr := FileRead{Path: p}
	st, err := os.Stat(p)
	if err != nil {
		fr.Errno = errnoName(err)
		return fr
	}
	if st.IsDir() {
		ents, err := os.ReadDir(p)
		fr.Errno = errnoName(err)
		fr.Bytes = len(ents)
		return fr
	}
	f, err := os.Open(p)
	if err != nil {
		fr.Errno = errnoName(err)
		return fr
	}
	defer f.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(f, 4096))
	fr.Bytes = int(n)
	fr.Errno = errnoName(err)
	return fr
}

// openWrite opens a file for writing and closes it without writing.
func openWrite(p string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// create makes a new file in dir and removes it again.
func create(dir string) error {
	p := filepath.Join(dir, fmt.Sprintf(".sandboxd-probe-%d", os.Getpid()))
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err == nil {
		unix.Close(fd)
		unix.Unlink(p)
	}
	return err
}

func writes(readOnly []string) []Attempt {
	var out []Attempt
	add := func(name string, err error) { out = append(out, Attempt{Name: name, Errno: errnoName(err)}) }
	for _, p := range ProcSysWrites {
		add(p, openWrite(p))
	}
	ctrls, _ := filepath.Glob("/sys/fs/cgroup/*")
	ctrls = append(ctrls, "/sys/fs/cgroup")
	for _, c := range ctrls {
		if st, err := os.Lstat(c); err != nil || !st.IsDir() {
			continue
		}
		if _, err := os.Lstat(c + "/release_agent"); err == nil {
			add(c+"/release_agent", openWrite(c+"/release_agent"))
		}
		d := c + "/sandboxd-probe"
		err := unix.Mkdir(d, 0o755)
		if err == nil {
			unix.Rmdir(d)
		}
		add("mkdir "+d, err)
	}
	add("create /", create("/"))
	add("create /etc", create("/etc"))
	for _, d := range readOnly {
		add("create "+d, create(d))
	}
	// The result channel and other processes' stdio.
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		if pid, _ := strconv.Atoi(filepath.Base(p)); pid == os.Getpid() || ownerOf(p) == os.Getuid() {
			continue
		}
		for _, fd := range []string{"0", "1", "2"} {
			if _, err := os.Lstat(p + "/fd/" + fd); errors.Is(err, os.ErrNotExist) {
				continue
			}
			add(p+"/fd/"+fd, openWrite(p+"/fd/"+fd))
		}
	}
	return out
}

func interfaces() []string {
	ifs, err := net.Interfaces()
	if err != nil {
		// Fall back to /proc/net/dev.
		var out []string
		for i, l := range lines("/proc/net/dev") {
			if name, _, ok := strings.Cut(l, ":"); ok && i >= 2 {
				out = append(out, strings.TrimSpace(name))
			}
		}
		return out
	}
	var out []string
	for _, i := range ifs {
		out = append(out, i.Name)
	}
	sort.Strings(out)
	return out
}

func connect(addr string) *NetAttempt {
	a := &NetAttempt{Target: addr}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	c.Close()
	a.OK = true
	return a
}

func resolve(name string) *NetAttempt {
	a := &NetAttempt{Target: name}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	a.OK, a.Addrs = true, addrs
	return a
}
