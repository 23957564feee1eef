package selfcheck

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Property is one isolation property and whether it held.
type Property struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Expect is what the probe's report must show.
type Expect struct {
	// CandidateUID and CandidateGID are the ids candidate code runs as.
	CandidateUID, CandidateGID int
	// Env is the exact environment the job declared, besides PATH, which
	// the broker sets from the image (any value is accepted).
	Env map[string]string
	// Hostname is the sandbox's host name.
	Hostname string
	// Connect and Resolve, when set, require the probe to have tried them
	// (and failed).
	Connect, Resolve bool
	// ReadOnly are directories that must refuse new files.
	ReadOnly []string
	// Volumes are the mount points of the read-only volumes the broker
	// mounts (the helper's, the job's read-only inputs).
	Volumes []string
	// Runtime is the runtime the probe ran under ("" is runc). gVisor's
	// runsc shows some of the same isolation in its own form (see
	// foreignMounts); only runsc is judged by those forms.
	Runtime string
}

// helperCaps is the bounding set the container keeps for the helper
// (CAP_SETGID, CAP_SETUID); with no_new_privs and empty permitted and
// effective sets the candidate can never use it.
const helperCaps = 1<<6 | 1<<7

// Properties judges a probe report against what the sandbox should show:
// every isolation property is listed, held or not, in a fixed order; a
// missing observation is a failure, never a pass.
func Properties(r probe.Report, exp Expect) []Property {
	var out []Property
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, Property{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("report-schema", r.Schema == probe.Schema, "schema %q", r.Schema)

	// Identity and privileges.
	uidLine := fmt.Sprintf("%d %d %d %d", exp.CandidateUID, exp.CandidateUID, exp.CandidateUID, exp.CandidateUID)
	gidLine := fmt.Sprintf("%d %d %d %d", exp.CandidateGID, exp.CandidateGID, exp.CandidateGID, exp.CandidateGID)
	add("candidate-user", exp.CandidateUID > 0 && r.UID == exp.CandidateUID && r.Status["Uid"] == uidLine && r.Status["Gid"] == gidLine,
		"uid %d, Uid %q, Gid %q; want %d", r.UID, r.Status["Uid"], r.Status["Gid"], exp.CandidateUID)
	for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb"} {
		v, ok := capMask(r.Status[k])
		add("capabilities-"+strings.ToLower(strings.TrimPrefix(k, "Cap")), ok && v == 0, "%s %q, want 0", k, r.Status[k])
	}
	bnd, ok := capMask(r.Status["CapBnd"])
	add("capabilities-bounding", ok && bnd&^helperCaps == 0, "CapBnd %q, want a subset of CAP_SETGID|CAP_SETUID", r.Status["CapBnd"])
	add("no-new-privileges", r.Status["NoNewPrivs"] == "1", "NoNewPrivs %q", r.Status["NoNewPrivs"])
	add("seccomp-filter", r.Status["Seccomp"] == "2", "Seccomp %q, want 2 (filter)", r.Status["Seccomp"])

	// Syscalls: each must end in exactly the profile's errno.
	for _, s := range probe.Syscalls() {
		a, found := probe.Find(r.Syscalls, s.Name)
		add("syscall-"+s.Name, found && a.Errno == s.Want, "errno %q, want %s%s", a.Errno, s.Want, missing(found))
	}
	for _, s := range probe.Sockets() {
		a, found := probe.Find(r.Sockets, s.Name)
		add("socket-"+s.Name, found && a.Errno != "", "errno %q, want a failure%s", a.Errno, missing(found))
	}

	// Files.
	for _, p := range probe.MaskedPaths {
		fr, found := findRead(r.Reads, p)
		add("masked-"+p, found && fr.Bytes == 0, "%d bytes or entries (errno %q), want none%s", fr.Bytes, fr.Errno, missing(found))
	}
	for _, fr := range r.Reads {
		if strings.HasSuffix(fr.Path, "/environ") {
			add("secret-"+fr.Path, fr.Errno != "" && fr.Bytes == 0, "errno %q, %d bytes", fr.Errno, fr.Bytes)
		}
	}
	wantWrites := append([]string{}, probe.ProcSysWrites...)
	wantWrites = append(wantWrites, "create /", "create /etc")
	for _, d := range exp.ReadOnly {
		wantWrites = append(wantWrites, "create "+d)
	}
	for _, w := range wantWrites {
		a, found := probe.Find(r.Writes, w)
		add("write-"+w, found && a.Errno != "", "errno %q, want a failure%s", a.Errno, missing(found))
	}
	cgroupWrites := 0
	for _, a := range r.Writes {
		if slices.Contains(wantWrites, a.Name) {
			continue
		}
		if strings.Contains(a.Name, "/sys/fs/cgroup") {
			cgroupWrites++
		}
		add("write-"+a.Name, a.Errno != "", "errno %q, want a failure", a.Errno)
	}
	add("cgroup-tree-probed", cgroupWrites > 0, "%d cgroup write attempts", cgroupWrites)
	add("root-read-only", r.RootReadOnly, "statfs(/) read-only: %v", r.RootReadOnly)
	add("dev-shm", r.DevShm.Errno != "", "creating a file in /dev/shm: errno %q, want a failure", r.DevShm.Errno)
	abi := probe.ABIAttempt{Outcome: "not observed"}
	if r.ForeignABI != nil {
		abi = *r.ForeignABI
	}
	add("foreign-abi", r.ForeignABI != nil && abi.ABI == probe.ForeignABI && abi.Refused(), "a syscall through the %s ABI: %s, want it refused (the %q ABI)", abi.ABI, abi.Outcome, probe.ForeignABI)

	// Network.
	add("network-interfaces", slices.Equal(r.Interfaces, []string{"lo"}), "interfaces %v, want [lo]", r.Interfaces)
	if exp.Connect {
		add("host-loopback", r.Connect != nil && !r.Connect.OK, "connect %s", netDetail(r.Connect))
	}
	if exp.Resolve {
		add("name-resolution", r.Resolve != nil && !r.Resolve.OK, "resolve %s", netDetail(r.Resolve))
	}
	add("resolv-conf", resolvLoopbackOnly(r.ResolvConf), "resolv.conf %q, want only nameserver 127.0.0.1", r.ResolvConf)

	// Host details.
	add("environment", envExact(r.Env, exp.Env), "environment %q", r.Env)
	add("hostname", r.Hostname == exp.Hostname, "hostname %q, want %q", r.Hostname, exp.Hostname)
	add("cgroup-namespace", cgroupPrivate(r.Cgroup), "cgroup %q, want every path /", r.Cgroup)
	bad := foreignMounts(r.Mountinfo, exp.Runtime == sandbox.RuntimeRunsc, exp.Volumes)
	add("mounts", len(r.Mountinfo) > 0 && len(bad) == 0, "unexpected mounts %q", bad)
	leaked := leakedFDs(r.FDs)
	add("file-descriptors", r.FDs != nil && len(leaked) == 0, "descriptors other than stdin /dev/null, stdout and stderr pipes: %q", leaked)
	return out
}

func missing(found bool) string {
	if found {
		return ""
	}
	return " (not observed)"
}

func capMask(s string) (uint64, bool) {
	v, err := strconv.ParseUint(s, 16, 64)
	return v, err == nil && s != ""
}

func findRead(list []probe.FileRead, p string) (probe.FileRead, bool) {
	for _, fr := range list {
		if fr.Path == p {
			return fr, true
		}
	}
	return probe.FileRead{}, false
}

func netDetail(a *probe.NetAttempt) string {
	switch {
	case a == nil:
		return "not attempted"
	case a.OK:
		return fmt.Sprintf("%s succeeded %v", a.Target, a.Addrs)
	}
	return fmt.Sprintf("%s failed: %s", a.Target, a.Error)
}

func resolvLoopbackOnly(s string) bool {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.Join(strings.Fields(l), " ") != "nameserver 127.0.0.1" {
			return false
		}
		n++
	}
	return n > 0
}

func envExact(got []string, want map[string]string) bool {
	seen := map[string]bool{}
	for _, kv := range got {
		k, v, _ := strings.Cut(kv, "=")
		if seen[k] {
			return false
		}
		seen[k] = true
		if k == "PATH" {
			if w, ok := want[k]; ok && w != v {
				return false
			}
			continue
		}
		if w, ok := want[k]; !ok || w != v {
			return false
		}
	}
	for k := range want {
		if !seen[k] {
			return false
		}
	}
	return seen["PATH"]
}

func cgroupPrivate(lines []string) bool {
	if len(lines) == 0 {
		return false
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, ":/") {
			return false
		}
	}
	return true
}

// engineOwned are the host-side roots the engine itself mounts into every
// container (its own volumes, the per-container resolv.conf, hostname and
// hosts, and docker-init). The mount table shows their host paths; that is
// the engine's doing and reveals only its data root. Anything else from a
// host filesystem is a bind mount of the host and fails.
var engineOwned = []*regexp.Regexp{
	regexp.MustCompile(`/volumes/[A-Za-z0-9][A-Za-z0-9_.-]*/_data$`),
	regexp.MustCompile(`/containers/[0-9a-f]{64}/(resolv\.conf|hostname|hosts)$`),
}

// virtualFS are filesystems without a host-side root.
var virtualFS = map[string]bool{
	"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true, "cgroup": true, "cgroup2": true,
	"overlay": true, "fuse-overlayfs": true, "fuse.fuse-overlayfs": true,
}

// foreignMounts returns the mount table lines that are neither virtual, the
// root filesystem, engine-owned, nor the init binary at /sbin/docker-init;
// and every socket-looking mount point. Under gVisor (gvisor true) it also
// accepts gVisor's forms of the broker's own mounts, and only those.
func foreignMounts(lines []string, gvisor bool, volumes []string) []string {
	var bad []string
	for _, l := range lines {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			bad = append(bad, l)
			continue
		}
		root, target, fstype := f[3], f[4], g[0]
		switch {
		case strings.HasSuffix(target, ".sock"):
			bad = append(bad, l)
		case virtualFS[fstype] || target == "/":
		case target == "/sbin/docker-init":
			if !strings.HasPrefix(f[5], "ro") {
				bad = append(bad, l)
			}
		case slices.ContainsFunc(engineOwned, func(re *regexp.Regexp) bool { return re.MatchString(root) }):
			if !strings.HasPrefix(f[5], "ro") {
				bad = append(bad, l) // every engine-owned mount is read-only here
			}
		case gvisor && gvisorOwn(f, g, volumes):
		default:
			bad = append(bad, l)
		}
	}
	return bad
}

// gvisorOwn reports whether a mount table line (fields before and after
// " - ") is gVisor's form of a mount the broker asked for. gVisor's kernel
// shows the sandbox's /dev as its own device filesystem "dev" (runc: a
// tmpfs), and every bind mount as "9p" served by its gofer over a
// descriptor (trans=fd), rooted at "/": no host path shows, as it does for
// runc's engine-owned volumes. Accepted only at the broker's read-only
// volume mount points, mounted read-only; a 9p mount anywhere else, or
// writable, is foreign, as is every such line under runc.
func gvisorOwn(f, g []string, volumes []string) bool {
	root, target, opts, fstype := f[3], f[4], f[5], g[0]
	switch {
	case fstype == "dev" && target == "/dev" && root == "/":
		return true
	case fstype == "9p" && root == "/" && slices.Contains(volumes, target):
		super := ""
		if len(g) >= 3 {
			super = g[2]
		}
		return slices.Contains(strings.Split(opts, ","), "ro") &&
			strings.HasPrefix(super, "ro,") && slices.Contains(strings.Split(super, ","), "trans=fd")
	}
	return false
}

// runtimeFD matches the cgroup files the Go runtime keeps open to follow
// its CPU limit (Go 1.25+): cgroup v1's under the cpu controller, v2's at
// the root of the sandbox's own cgroup namespace (as gVisor's cgroup v2
// shows it); anything else beyond stdio is inherited.
var runtimeFD = regexp.MustCompile(`^/sys/fs/cgroup/(cpu[^/]*/cpu\.(cfs_quota_us|cfs_period_us|max)|cpu\.max)$`)

func leakedFDs(fds map[string]string) []string {
	var out []string
	for fd, target := range fds {
		switch {
		case fd == "0" && target == "/dev/null":
			continue
		case (fd == "1" || fd == "2") && strings.HasPrefix(target, "pipe:["):
			continue
		case fd != "0" && fd != "1" && fd != "2" && runtimeFD.MatchString(target):
			continue
		}
		out = append(out, fd+" -> "+target)
	}
	slices.Sort(out)
	return out
}

// Failed returns the properties that did not hold.
func Failed(props []Property) []Property {
	var out []Property
	for _, p := range props {
		if !p.OK {
			out = append(out, p)
		}
	}
	return out
}
