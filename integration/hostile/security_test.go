package hostile

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/selfcheck"
	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/sandbox"
)

// capNames are the Linux capabilities by number (capability.h).
var capNames = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// ulimitNames maps the engine's ulimit names to /proc/self/limits rows.
var ulimitNames = map[string]string{
	"core": "Max core file size", "cpu": "Max cpu time", "data": "Max data size",
	"fsize": "Max file size", "locks": "Max file locks", "memlock": "Max locked memory",
	"msgqueue": "Max msgqueue size", "nice": "Max nice priority", "nofile": "Max open files",
	"nproc": "Max processes", "rss": "Max resident set", "rtprio": "Max realtime priority",
	"rttime": "Max realtime timeout", "sigpending": "Max pending signals", "stack": "Max stack size",
	"as": "Max address space",
}

// securityUnobservable are the fields of the record the probe cannot see
// from inside, each with the reason.
var securityUnobservable = map[string]string{
	"user":        "the helper's own user: the probe runs as the candidate it dropped to",
	"code_uid":    "the self-check runs no exec service",
	"log_driver":  "the engine's side of the container's stdout",
	"log_options": "the engine's side of the container's stdout",
	"runtime":     "the OCI runtime leaves no trace the probe can name",
	"relaxations": "a list of what the broker relaxed; none for the self-check",
}

// runscUnobservable are the fields the probe cannot see from inside gVisor,
// whose kernel (the sentry) answers /proc and /sys itself: the settings are
// the host's, on the sentry's own processes.
var runscUnobservable = map[string]string{
	"userns_mode":   "gVisor's /proc/self/ns/user names the sentry's own user namespace, never the host's one the sentry runs in",
	"oom_score_adj": "gVisor's /proc/self/oom_score_adj is its own (0); the host's applies to the sentry",
	"memory":        "gVisor's /sys/fs/cgroup is its own cgroup v2 (memory.max \"max\"); the limit is the host cgroup's (memory-bomb ends oom_killed)",
	"memory_swap":   "gVisor's /sys/fs/cgroup is its own; the limit is the host cgroup's",
	"nano_cpus":     "gVisor's cpu.max is its own (\"max\"); the quota is the host cgroup's",
	"pids_limit":    "the host cgroup bounds gVisor's own tasks; the job's pids limit is RLIMIT_NPROC, compared as ulimits nproc (fork-bomb-probe ends in EAGAIN)",
}

// TestSecurityRecordIsWhatTheProbeSees compares each field of the security
// record the broker reads back from the engine (and signs into the job's
// result) with what sandboxd-probe observes inside that very sandbox: a
// signed fact must be true. Every field of sandbox.Security is either
// compared or named in securityUnobservable with the reason.
func TestSecurityRecordIsWhatTheProbeSees(t *testing.T) {
	t.Parallel()
	r, err := selfcheck.Run(context.Background(), selfcheckOptions(t, ""))
	if r == nil {
		t.Fatalf("selfcheck: %v", err)
	}
	sec, p := r.Result.Security, r.Probe
	checked := map[string]bool{}
	check := func(field string, recorded, observed any) {
		t.Helper()
		checked[field] = true
		if why := runscUnobservable[field]; why != "" && env.Runtime == sandbox.RuntimeRunsc {
			t.Logf("%s: recorded %v; not observable on runsc: %s", field, recorded, why)
			return
		}
		if fmt.Sprint(recorded) != fmt.Sprint(observed) {
			t.Errorf("%s: the signed record says %v, the probe observed %v", field, recorded, observed)
		}
	}
	// A namespace is the host's when its /proc/self/ns link is this
	// process's (the test runs beside the engine, in its namespaces).
	mode := func(ns string) string {
		t.Helper()
		hostNS, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		if p.Namespaces[ns] == "" || strings.HasPrefix(p.Namespaces[ns], "error") {
			t.Fatalf("the probe could not read its %s namespace: %q", ns, p.Namespaces[ns])
		}
		if p.Namespaces[ns] == hostNS {
			return "host"
		}
		return "private"
	}
	userns := mode("user")
	check("userns_mode", sec.UsernsMode, userns)
	if userns == "host" && !slices.Equal(p.UIDMap, []string{"0 0 4294967295"}) {
		t.Errorf("userns_mode host, but the uid map is %q, not the identity", p.UIDMap)
	}
	check("pid_mode", sec.PidMode, mode("pid"))
	check("uts_mode", sec.UTSMode, mode("uts"))
	check("cgroupns_mode", sec.CgroupnsMode, mode("cgroup"))
	ipc := mode("ipc")
	if ipc == "private" && p.DevShm.Errno != "" {
		ipc = "none" // a namespace of its own without /dev/shm
	}
	check("ipc_mode", sec.IpcMode, ipc)
	net := mode("net")
	if net == "private" && slices.Equal(p.Interfaces, []string{"lo"}) {
		net = "none" // a namespace of its own with loopback only
	}
	check("network_mode", sec.NetworkMode, net)

	check("candidate_uid", sec.CandidateUID, p.UID)
	id := strconv.Itoa(sec.CandidateUID)
	if want := strings.Repeat(id+" ", 3) + id; p.Status["Uid"] != want {
		t.Errorf("candidate uid %d, but /proc/self/status Uid is %q", sec.CandidateUID, p.Status["Uid"])
	}
	bnd, err := strconv.ParseUint(p.Status["CapBnd"], 16, 64)
	if err != nil {
		t.Fatalf("CapBnd %q: %v", p.Status["CapBnd"], err)
	}
	var bounding []string
	for i, n := range capNames {
		if bnd&(1<<i) != 0 {
			bounding = append(bounding, "CAP_"+n)
		}
	}
	// Dropping ALL and adding CapAdd leaves exactly CapAdd in the bounding
	// set, which the candidate can never raise: it holds none of them.
	check("cap_drop", sec.CapDrop, []string{"ALL"})
	check("cap_add", sec.CapAdd, bounding)
	for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb"} {
		if p.Status[k] != "0000000000000000" {
			t.Errorf("the candidate holds capabilities: %s %s", k, p.Status[k])
		}
	}
	check("privileged", sec.Privileged, p.Status["Seccomp"] == "0" && slices.Contains(bounding, "CAP_SYS_ADMIN"))
	check("no_new_privileges", sec.NoNewPrivs, p.Status["NoNewPrivs"] == "1")
	// Mode 2 is a seccomp filter; the record names its profile by digest,
	// whose bytes the probe cannot see: it sees that a filter is on.
	check("seccomp_digest", sec.SeccompDigest != "", p.Status["Seccomp"] == "2")
	check("readonly_rootfs", sec.ReadonlyRootfs, p.RootReadOnly)
	var ns []string
	for _, l := range strings.Split(p.ResolvConf, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			ns = append(ns, f[1])
		}
	}
	check("dns", sec.DNS, ns)
	check("oom_score_adj", sec.OomScoreAdj, p.OOMScoreAdj)
	// Docker runs docker-init as process 1; on containerd the helper is
	// process 1 and is the init itself (it reaps; see package helper).
	init := p.Init == "docker-init" || p.Init == "tini"
	if env.EngineName == "containerd" {
		init = p.Init == "shim"
	}
	check("init", sec.Init, init)

	// Cgroup limits, v1 or v2 (on runsc, gVisor's own).
	cg := p.CgroupLimits
	switch {
	case env.Runtime == sandbox.RuntimeRunsc:
		check("memory", sec.Memory, "")
		check("memory_swap", sec.MemorySwap, "")
		check("nano_cpus", sec.NanoCPUs, "")
		check("pids_limit", sec.PidsLimit, "")
	case cg["memory/memory.limit_in_bytes"] != "":
		check("memory", sec.Memory, cg["memory/memory.limit_in_bytes"])
		if v, ok := cg["memory/memory.memsw.limit_in_bytes"]; ok {
			check("memory_swap", sec.MemorySwap, v)
		} else {
			// Without swap accounting the engine cannot set it either.
			checked["memory_swap"] = true
			t.Logf("memory_swap: this kernel has no swap accounting; not observable")
		}
		quota, _ := strconv.ParseInt(cg["cpu/cpu.cfs_quota_us"], 10, 64)
		period, _ := strconv.ParseInt(cg["cpu/cpu.cfs_period_us"], 10, 64)
		if period == 0 {
			t.Fatalf("cpu.cfs_period_us %q", cg["cpu/cpu.cfs_period_us"])
		}
		check("nano_cpus", sec.NanoCPUs, quota*1e9/period)
		check("pids_limit", sec.PidsLimit, cg["pids/pids.max"])
	case cg["memory.max"] != "":
		check("memory", sec.Memory, cg["memory.max"])
		swap, _ := strconv.ParseInt(cg["memory.swap.max"], 10, 64)
		check("memory_swap", sec.MemorySwap, sec.Memory+swap)
		var quota, period int64
		fmt.Sscan(cg["cpu.max"], &quota, &period)
		if period == 0 {
			t.Fatalf("cpu.max %q", cg["cpu.max"])
		}
		check("nano_cpus", sec.NanoCPUs, quota*1e9/period)
		check("pids_limit", sec.PidsLimit, cg["pids.max"])
	default:
		t.Fatalf("the probe saw no cgroup limits: %v", cg)
	}

	limit := func(v int64) string {
		if v < 0 {
			return "unlimited"
		}
		return strconv.FormatInt(v, 10)
	}
	checked["ulimits"] = true
	if len(sec.Ulimits) == 0 {
		t.Errorf("ulimits: the record has none")
	}
	for _, u := range sec.Ulimits {
		row, ok := ulimitNames[u.Name]
		if !ok {
			t.Errorf("ulimit %q: no /proc/self/limits row known", u.Name)
			continue
		}
		check("ulimits "+u.Name, limit(u.Soft)+" "+limit(u.Hard), p.Rlimits[row])
	}

	mounts := parseMountinfo(p.Mountinfo)
	checked["tmpfs"] = true
	for _, tf := range sec.Tmpfs {
		path, opts, _ := strings.Cut(tf, ":")
		m, ok := mounts[path]
		if !ok || m.fstype != "tmpfs" {
			t.Errorf("tmpfs %s: recorded, but the probe sees %+v there", tf, m)
			continue
		}
		for _, o := range strings.Split(opts, ",") {
			if o == "nodev" && env.Runtime == sandbox.RuntimeRunsc {
				// gVisor ignores nodev (its tmpfs has no host devices to
				// reach); the candidate cannot make a node there either
				// (hostile case mknod-on-scratch).
				continue
			}
			if (o == "noexec" || o == "nosuid" || o == "nodev") && !slices.Contains(m.opts, o) {
				t.Errorf("tmpfs %s: recorded %s, mounted %v", path, o, m.opts)
			}
		}
	}
	checked["mounts"] = true
	for _, mt := range sec.Mounts {
		m, ok := mounts[mt.Target]
		if !ok {
			t.Errorf("mount %s: recorded, the probe sees no mount there", mt.Target)
			continue
		}
		check("mounts "+mt.Target+" read-only", mt.ReadOnly, slices.Contains(m.opts, "ro"))
	}
	// Masked paths read as nothing; the probe reads the engine's defaults.
	checked["masked_paths"] = true
	for _, path := range probe.MaskedPaths {
		if !slices.Contains(sec.MaskedPaths, path) {
			t.Errorf("masked_paths: %s is masked in the sandbox but not in the record %v", path, sec.MaskedPaths)
		}
	}
	for _, rd := range p.Reads {
		if slices.Contains(sec.MaskedPaths, rd.Path) && rd.Bytes != 0 {
			t.Errorf("masked_paths: %s is recorded masked, the probe read %d bytes", rd.Path, rd.Bytes)
		}
	}
	checked["readonly_paths"] = true
	seen := 0
	for _, path := range sec.ReadonlyPaths {
		if m, ok := mounts[path]; ok {
			seen++
			if !slices.Contains(m.opts, "ro") {
				t.Errorf("readonly_paths: %s is recorded read-only, mounted %v", path, m.opts)
			}
		}
	}
	if seen == 0 && env.Runtime == sandbox.RuntimeRunsc {
		// gVisor's procfs refuses those writes itself, with no mount of
		// its own: every write the probe tried under them failed.
		for _, w := range p.Writes {
			if slices.ContainsFunc(sec.ReadonlyPaths, func(ro string) bool { return w.Name == ro || strings.HasPrefix(w.Name, ro+"/") }) {
				seen++
				if w.Errno == "" {
					t.Errorf("readonly_paths: the probe wrote %s", w.Name)
				}
			}
		}
	}
	if seen == 0 {
		t.Errorf("readonly_paths: none of %v is a mount the probe sees (or, on runsc, a write it tried)", sec.ReadonlyPaths)
	}

	// Every field is compared or said to be unobservable.
	st := reflect.TypeOf(sandbox.Security{})
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if !checked[name] && securityUnobservable[name] == "" {
			t.Errorf("field %s of the security record is neither compared with the probe nor said to be unobservable", name)
		}
	}
}

type mountPoint struct {
	fstype string
	opts   []string // per-mount options (ro, nosuid, …)
}

// parseMountinfo maps each mount point of /proc/self/mountinfo lines to
// its type and options; a later mount on the same point wins.
func parseMountinfo(lines []string) map[string]mountPoint {
	out := map[string]mountPoint{}
	for _, l := range lines {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 {
			continue
		}
		out[f[4]] = mountPoint{fstype: g[0], opts: strings.Split(f[5], ",")}
	}
	return out
}
