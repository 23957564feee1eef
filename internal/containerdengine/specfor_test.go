package containerdengine

import (
	"encoding/json"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/profiles/seccomp"
)

// specOfOptions is the spec made for o by the test engine, or the error.
func specOfOptions(o client.ContainerCreateOptions) (*specs.Spec, error) {
	return testEngine().specFor(o, imageInfo{id: o.Config.Image, env: []string{"PATH=/bin"}}, "b-job-0123456789ab")
}

// The root filesystem is read-only exactly when asked; the sandbox always
// asks.
func TestSpecForRootfs(t *testing.T) {
	for _, ro := range []bool{true, false} {
		o := sandboxOptions()
		o.HostConfig.ReadonlyRootfs = ro
		s, err := specOfOptions(o)
		if err != nil {
			t.Fatal(err)
		}
		if s.Root == nil || s.Root.Readonly != ro {
			t.Errorf("ReadonlyRootfs %v: got root %+v, want readonly %v", ro, s.Root, ro)
		}
	}
}

// Capabilities are CapDrop ALL plus CapAdd, spelled as the kernel names
// them, in every set a process can use; nothing is inheritable or
// ambient. Any other drop list is refused: this engine has no default set
// to subtract from.
func TestSpecForCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name      string
		drop, add []string
		want      []string
		refused   string // the setting named, if refused
	}{
		{"the sandbox's", []string{"ALL"}, []string{"CAP_SETGID", "CAP_SETUID"}, []string{"CAP_SETGID", "CAP_SETUID"}, ""},
		{"none added", []string{"ALL"}, nil, []string{}, ""},
		{"Docker's spelling", []string{"ALL"}, []string{"setuid", "Net_Bind_Service"}, []string{"CAP_NET_BIND_SERVICE", "CAP_SETUID"}, ""},
		{"duplicates", []string{"ALL"}, []string{"SETUID", "CAP_SETUID", "cap_setuid"}, []string{"CAP_SETUID"}, ""},
		{"the populate container's (never started)", nil, nil, []string{}, ""},
		{"nothing dropped", nil, []string{"CAP_SETUID"}, nil, "CapDrop"},
		{"one dropped", []string{"NET_RAW"}, nil, nil, "CapDrop"},
		{"ALL and one more dropped", []string{"ALL", "NET_RAW"}, nil, nil, "CapDrop"},
		{"all added back", []string{"ALL"}, []string{"ALL"}, nil, "CapAdd"},
		{"all added back, kernel spelling", []string{"ALL"}, []string{"cap_all"}, nil, "CapAdd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := sandboxOptions()
			o.HostConfig.CapDrop, o.HostConfig.CapAdd = tc.drop, tc.add
			s, err := specOfOptions(o)
			if tc.refused != "" {
				wantUnsupported(t, s, err, tc.refused)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := s.Process.Capabilities
			for _, set := range []struct {
				name string
				got  []string
			}{{"bounding", c.Bounding}, {"effective", c.Effective}, {"permitted", c.Permitted}} {
				if !slices.Equal(set.got, tc.want) {
					t.Errorf("%s: got %v, want %v", set.name, set.got, tc.want)
				}
			}
			if len(c.Inheritable)+len(c.Ambient) != 0 {
				t.Errorf("inheritable %v, ambient %v: want none", c.Inheritable, c.Ambient)
			}
		})
	}
}

// no-new-privileges and the seccomp filter are set exactly when asked;
// the filter is the project profile (deny by default, none of its denied
// syscalls allowed). A profile that does not load, "unconfined" among
// them, refuses the container: it never runs unfiltered.
func TestSpecForNoNewPrivilegesAndSeccomp(t *testing.T) {
	var profile struct {
		DefaultAction specs.LinuxSeccompAction `json:"defaultAction"`
	}
	if err := json.Unmarshal(seccomp.JSON(), &profile); err != nil {
		t.Fatal(err)
	}
	nnp, filter := "no-new-privileges:true", "seccomp="+string(seccomp.JSON())
	for _, tc := range []struct {
		name string
		opts []string
	}{
		{"both", []string{nnp, filter}},
		{"no-new-privileges only", []string{nnp}},
		{"seccomp only", []string{filter}},
		{"neither", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := sandboxOptions()
			o.HostConfig.SecurityOpt = tc.opts
			s, err := specOfOptions(o)
			if err != nil {
				t.Fatal(err)
			}
			if want := slices.Contains(tc.opts, nnp); s.Process.NoNewPrivileges != want {
				t.Errorf("noNewPrivileges: got %v, want %v", s.Process.NoNewPrivileges, want)
			}
			if !slices.Contains(tc.opts, filter) {
				if s.Linux.Seccomp != nil {
					t.Errorf("seccomp: got a filter (default %s), want none", s.Linux.Seccomp.DefaultAction)
				}
				return
			}
			sc := s.Linux.Seccomp
			if sc == nil {
				t.Fatal("seccomp: got no filter, want the project profile")
			}
			if sc.DefaultAction != profile.DefaultAction {
				t.Errorf("seccomp default action: got %s, want the profile's %s", sc.DefaultAction, profile.DefaultAction)
			}
			for _, rule := range sc.Syscalls {
				if rule.Action != specs.ActAllow {
					continue
				}
				for _, name := range rule.Names {
					if slices.Contains(seccomp.Denied, name) {
						t.Errorf("seccomp allows %s, which the profile denies", name)
					}
				}
			}
		})
	}
	for _, opt := range []string{"seccomp=unconfined", "seccomp={", "seccomp="} {
		o := sandboxOptions()
		o.HostConfig.SecurityOpt = []string{nnp, opt}
		if s, err := specOfOptions(o); err == nil || s != nil {
			t.Errorf("SecurityOpt %q: got spec %v, error %v; want it refused", opt, s != nil, err)
		}
	}
}

// The user is a numeric uid:gid, as the broker always gives it; a name or
// half a pair cannot be resolved without the image's /etc/passwd, so it is
// refused, never run as root by default.
func TestSpecForUser(t *testing.T) {
	for _, tc := range []struct {
		user     string
		uid, gid uint32
	}{
		{"", 0, 0},
		{"0:0", 0, 0},
		{"65534:65534", 65534, 65534},
		{"1000:2000", 1000, 2000},
		{"4294967295:1", 4294967295, 1},
	} {
		o := sandboxOptions()
		o.Config.User = tc.user
		s, err := specOfOptions(o)
		if err != nil {
			t.Errorf("User %q: %v", tc.user, err)
			continue
		}
		if u := s.Process.User; u.UID != tc.uid || u.GID != tc.gid || len(u.AdditionalGids) != 0 {
			t.Errorf("User %q: got %+v, want uid %d gid %d and no other groups", tc.user, u, tc.uid, tc.gid)
		}
	}
	for _, user := range []string{"root", "nobody:nogroup", "1000", "1000:", ":1000", "1000:1000:1", "-1:0", "01:2", " 1:2", "1:2 ", "4294967296:0"} {
		o := sandboxOptions()
		o.Config.User = user
		s, err := specOfOptions(o)
		wantUnsupported(t, s, err, "User")
	}
}

// Memory, swap, CPU, pids and the OOM score are the cgroup limits asked
// for, in the OCI spec's units (CPU: a quota of the 100 ms CFS period, as
// Docker sets NanoCPUs); an unset limit is absent from the spec (and the
// security check refuses a sandbox without it).
func TestSpecForLimits(t *testing.T) {
	for _, tc := range []struct {
		name              string
		memory, swap, cpu int64
		pids              *int64
		oom               int
	}{
		{"the sandbox's", 128 << 20, 128 << 20, 1_000_000_000, i64(64), 1000},
		{"fractional CPU", 64 << 20, 64 << 20, 1_500_000_000, i64(1), 500},
		{"a tenth of a CPU", 1 << 30, 1 << 30, 100_000_000, i64(4096), 0},
		{"swap unset", 256 << 20, 0, 2_000_000_000, i64(10), 1},
		{"nothing limited", 0, 0, 0, nil, 0},
		{"pids zero and negative are no limit", 0, 0, 0, i64(0), 0},
		{"pids unlimited", 0, 0, 0, i64(-1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := sandboxOptions()
			r := &o.HostConfig.Resources
			r.Memory, r.MemorySwap, r.NanoCPUs, r.PidsLimit = tc.memory, tc.swap, tc.cpu, tc.pids
			o.HostConfig.OomScoreAdj = tc.oom
			s, err := specOfOptions(o)
			if err != nil {
				t.Fatal(err)
			}
			res := s.Linux.Resources
			switch m := res.Memory; {
			case tc.memory == 0 && m != nil:
				t.Errorf("memory: got %+v, want no limit", m)
			case tc.memory > 0 && (m == nil || m.Limit == nil || *m.Limit != tc.memory):
				t.Errorf("memory: got %+v, want limit %d", m, tc.memory)
			case tc.memory > 0 && tc.swap == 0 && m.Swap != nil:
				t.Errorf("memory swap: got %d, want unset", *m.Swap)
			case tc.memory > 0 && tc.swap != 0 && (m.Swap == nil || *m.Swap != tc.swap):
				t.Errorf("memory swap: got %v, want %d", m.Swap, tc.swap)
			}
			switch c := res.CPU; {
			case tc.cpu == 0 && c != nil:
				t.Errorf("cpu: got %+v, want no limit", c)
			case tc.cpu > 0 && (c == nil || c.Quota == nil || c.Period == nil):
				t.Errorf("cpu: got %+v, want a quota and a period", c)
			case tc.cpu > 0 && (*c.Period != 100_000 || *c.Quota*1e9/int64(*c.Period) != tc.cpu):
				t.Errorf("cpu: got quota %d of period %d, want %d nano-CPUs of a 100000 µs period", *c.Quota, *c.Period, tc.cpu)
			}
			switch p := res.Pids; {
			case (tc.pids == nil || *tc.pids <= 0) && p != nil:
				t.Errorf("pids: got %+v, want no limit", p)
			case tc.pids != nil && *tc.pids > 0 && (p == nil || p.Limit != *tc.pids):
				t.Errorf("pids: got %+v, want %d", p, *tc.pids)
			}
			switch a := s.Process.OOMScoreAdj; {
			case tc.oom == 0 && a != nil:
				t.Errorf("oom score: got %d, want unset", *a)
			case tc.oom != 0 && (a == nil || *a != tc.oom):
				t.Errorf("oom score: got %v, want %d", a, tc.oom)
			}
		})
	}
}

// Every ulimit Docker names becomes the kernel's RLIMIT of that name with
// the same soft and hard values; a name it does not know is refused.
func TestSpecForUlimits(t *testing.T) {
	names := []string{"core", "fsize", "nofile", "nproc", "cpu", "data", "stack", "memlock", "as", "locks",
		"sigpending", "msgqueue", "nice", "rtprio", "rttime", "rss"}
	o := sandboxOptions()
	o.HostConfig.Ulimits = nil
	for i, n := range names {
		o.HostConfig.Ulimits = append(o.HostConfig.Ulimits, &container.Ulimit{Name: n, Soft: int64(i), Hard: int64(1000 + i)})
	}
	s, err := specOfOptions(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Process.Rlimits) != len(names) {
		t.Fatalf("got %d rlimits, want %d: %v", len(s.Process.Rlimits), len(names), s.Process.Rlimits)
	}
	for i, u := range o.HostConfig.Ulimits {
		want := specs.POSIXRlimit{Type: "RLIMIT_" + strings.ToUpper(u.Name), Soft: uint64(u.Soft), Hard: uint64(u.Hard)}
		if got := s.Process.Rlimits[i]; got != want {
			t.Errorf("ulimit %s: got %+v, want %+v", u.Name, got, want)
		}
	}
	for _, bad := range []string{"bogus", "NOFILE", "RLIMIT_NOFILE", ""} {
		o := sandboxOptions()
		o.HostConfig.Ulimits = append(o.HostConfig.Ulimits, &container.Ulimit{Name: bad, Soft: 1, Hard: 1})
		s, err := specOfOptions(o)
		wantUnsupported(t, s, err, "Ulimits")
	}
}

// A volume is a bind mount of the engine's own directory for it, with
// nosuid and nodev, read-only exactly when asked; scratch tmpfs carries
// the options asked for. Nothing else is mounted but the base mounts: no
// /dev/shm and no engine-written /etc files.
func TestSpecForMounts(t *testing.T) {
	e := testEngine()
	o := sandboxOptions()
	o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeVolume, Source: "b-out-3", Target: "/out"})
	s, err := e.specFor(o, imageInfo{}, "b-job-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	byDest := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		if _, dup := byDest[m.Destination]; dup {
			t.Errorf("%s is mounted twice", m.Destination)
		}
		byDest[m.Destination] = m
	}
	for _, v := range o.HostConfig.Mounts {
		m, ok := byDest[v.Target]
		if !ok {
			t.Errorf("volume %s: not mounted at %s", v.Source, v.Target)
			continue
		}
		wantSource := filepath.Join(e.cfg.StateDir, "volumes", v.Source, "_data")
		if m.Type != "bind" || m.Source != wantSource {
			t.Errorf("volume %s: got %s from %s, want a bind from %s", v.Source, m.Type, m.Source, wantSource)
		}
		for _, opt := range []string{"rbind", "nosuid", "nodev"} {
			if !slices.Contains(m.Options, opt) {
				t.Errorf("volume %s: options %v lack %s", v.Source, m.Options, opt)
			}
		}
		if ro := slices.Contains(m.Options, "ro"); ro != v.ReadOnly || slices.Contains(m.Options, "rw") == v.ReadOnly {
			t.Errorf("volume %s: options %v, want read-only %v", v.Source, m.Options, v.ReadOnly)
		}
	}
	for dst, opts := range o.HostConfig.Tmpfs {
		m, ok := byDest[dst]
		if !ok || m.Type != "tmpfs" || !slices.Equal(m.Options, strings.Split(opts, ",")) {
			t.Errorf("tmpfs %s: got %+v, want tmpfs with options %s", dst, m, opts)
		}
	}
	for dst, want := range map[string]string{"/proc": "proc", "/sys": "sysfs", "/sys/fs/cgroup": "cgroup", "/dev": "tmpfs", "/dev/pts": "devpts"} {
		if m, ok := byDest[dst]; !ok || m.Type != want {
			t.Errorf("%s: got %+v, want a %s mount", dst, m, want)
		}
	}
	for _, dst := range []string{"/sys", "/sys/fs/cgroup"} {
		if !slices.Contains(byDest[dst].Options, "ro") {
			t.Errorf("%s: options %v, want read-only", dst, byDest[dst].Options)
		}
	}
	for _, dst := range []string{"/dev/shm", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"} {
		if m, ok := byDest[dst]; ok {
			t.Errorf("%s is mounted (%+v), want nothing there", dst, m)
		}
	}
	if want := len(baseMounts) + len(o.HostConfig.Tmpfs) + len(o.HostConfig.Mounts); len(s.Mounts) != want {
		t.Errorf("got %d mounts, want %d: %v", len(s.Mounts), want, s.Mounts)
	}
}

// A mount target must be a clean absolute path outside the base mounts; a
// volume's name must be the engine's (it names a directory under
// StateDir); only volumes are mounted, never a host path.
func TestSpecForRefusesMounts(t *testing.T) {
	for _, target := range []string{"work", "/", "/work/../etc", "/work/", "/proc", "/proc/sys", "/sys/fs/cgroup/x", "/dev", "/dev/shm"} {
		for _, kind := range []string{"tmpfs", "volume"} {
			o := sandboxOptions()
			if kind == "tmpfs" {
				o.HostConfig.Tmpfs[target] = "size=1k,nosuid,nodev"
			} else {
				o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeVolume, Source: "b-x", Target: target})
			}
			s, err := specOfOptions(o)
			wantUnsupported(t, s, err, "Mounts")
		}
	}
	for _, typ := range []mount.Type{mount.TypeBind, mount.TypeTmpfs, mount.TypeNamedPipe, mount.TypeCluster, mount.TypeImage} {
		o := sandboxOptions()
		o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: typ, Source: "/", Target: "/host"})
		s, err := specOfOptions(o)
		wantUnsupported(t, s, err, "Mounts")
	}
	for _, name := range []string{"../../../etc", "a/b", ".hidden", "", strings.Repeat("v", 202)} {
		o := sandboxOptions()
		o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeVolume, Source: name, Target: "/v"})
		s, err := specOfOptions(o)
		if s != nil || !errdefs.IsInvalidArgument(err) {
			t.Errorf("volume %q: got spec %v, error %v; want an invalid argument", name, s != nil, err)
		}
	}
}

// The sandbox gets a new namespace of each kind but the user's, none of
// them joined from elsewhere; with network none the spec carries no hook
// of any kind (the runtime brings up lo in the new network namespace).
func TestSpecForNamespacesAndNetwork(t *testing.T) {
	e := testEngine()
	s, err := e.specFor(sandboxOptions(), imageInfo{}, "b-job-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	var got []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s, want a new one", n.Type, n.Path)
		}
		got = append(got, n.Type)
	}
	want := []specs.LinuxNamespaceType{specs.CgroupNamespace, specs.IPCNamespace, specs.MountNamespace, specs.NetworkNamespace, specs.PIDNamespace, specs.UTSNamespace}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("namespaces: got %v, want %v", got, want)
	}
	if len(s.Linux.UIDMappings)+len(s.Linux.GIDMappings) != 0 {
		t.Errorf("id mappings %v %v, want none", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	if s.Hooks != nil {
		t.Errorf("hooks: got %+v, want none", *s.Hooks)
	}
	if want := "/" + e.cfg.Namespace + "/b-job-0123456789ab"; s.Linux.CgroupsPath != want {
		t.Errorf("cgroups path: got %s, want %s", s.Linux.CgroupsPath, want)
	}
	if got := s.Linux.Resources.Devices; len(got) == 0 || got[0].Allow || got[0].Access != "rwm" {
		t.Errorf("device rules: got %v, want all devices denied first", got)
	}
	for _, d := range s.Linux.Resources.Devices[1:] {
		if !d.Allow || d.Type != "c" || d.Major == nil {
			t.Errorf("device rule %+v: want only character devices allowed by number", d)
		}
	}
	if len(s.Linux.Devices) != 0 || len(s.Linux.Sysctl) != 0 {
		t.Errorf("devices %v, sysctls %v: want none", s.Linux.Devices, s.Linux.Sysctl)
	}
	if s.Process.Terminal {
		t.Error("terminal: got true, want false")
	}
}

// What Docker masks and makes read-only is masked and read-only here, and
// each spec has its own copy: changing one spec never weakens the next.
func TestSpecForMaskedAndReadonlyPaths(t *testing.T) {
	hasDockers := func(when string, s *specs.Spec) {
		for _, p := range dockerMasked {
			if !slices.Contains(s.Linux.MaskedPaths, p) {
				t.Errorf("%s: masked paths %v lack %s", when, s.Linux.MaskedPaths, p)
			}
		}
		for _, p := range dockerReadonly {
			if !slices.Contains(s.Linux.ReadonlyPaths, p) {
				t.Errorf("%s: read-only paths %v lack %s", when, s.Linux.ReadonlyPaths, p)
			}
		}
	}
	first := sandboxSpec(t)
	hasDockers("a spec", first)
	clear(first.Linux.MaskedPaths)
	clear(first.Linux.ReadonlyPaths)
	clear(first.Linux.Resources.Devices)
	clear(first.Linux.Namespaces)
	first.Mounts[0] = specs.Mount{Destination: "/proc", Type: "bind", Source: "/proc"}
	next := sandboxSpec(t)
	hasDockers("the spec after one was changed", next)
	if err := checkSandboxSpec(testEngine(), next); err != nil {
		t.Errorf("the spec after one was changed fails the check: %v", err)
	}
}

// The process runs the entrypoint then the command, in the working
// directory asked (else /), with the image's environment, then HOSTNAME,
// then the container's, a later value of a name replacing an earlier one
// in its place.
func TestSpecForProcess(t *testing.T) {
	o := sandboxOptions()
	o.Config.Entrypoint, o.Config.Cmd = []string{"/bin/run", "-x"}, []string{"a", "b c"}
	o.Config.WorkingDir = ""
	o.Config.Hostname = "box"
	o.Config.Env = []string{"A=container", "B=2"}
	s, err := testEngine().specFor(o, imageInfo{env: []string{"PATH=/usr/bin", "A=image", "HOSTNAME=image"}}, "x")
	if err != nil {
		t.Fatal(err)
	}
	p := s.Process
	if want := []string{"/bin/run", "-x", "a", "b c"}; !slices.Equal(p.Args, want) {
		t.Errorf("args: got %q, want %q", p.Args, want)
	}
	if p.Cwd != "/" {
		t.Errorf("cwd: got %q, want /", p.Cwd)
	}
	if s.Hostname != o.Config.Hostname {
		t.Errorf("hostname: got %q, want %q", s.Hostname, o.Config.Hostname)
	}
	if want := []string{"PATH=/usr/bin", "A=container", "HOSTNAME=box", "B=2"}; !slices.Equal(p.Env, want) {
		t.Errorf("env: got %q, want %q", p.Env, want)
	}
	o.Config.WorkingDir = "/work"
	o.Config.Env = []string{"HOSTNAME=mine"}
	s, err = testEngine().specFor(o, imageInfo{}, "x")
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.Cwd != "/work" || !slices.Equal(s.Process.Env, []string{"HOSTNAME=mine"}) {
		t.Errorf("cwd %q, env %q: want /work and the container's own HOSTNAME", s.Process.Cwd, s.Process.Env)
	}
}

// The runtimes the engine knows are accepted; runsc only where the
// operator gave its binary.
func TestSpecForRuntimes(t *testing.T) {
	for _, rt := range []string{"", "runc", "runsc"} {
		o := sandboxOptions()
		o.HostConfig.Runtime = rt
		if _, err := specOfOptions(o); err != nil {
			t.Errorf("runtime %q: %v", rt, err)
		}
	}
	runcOnly := testEngine()
	delete(runcOnly.runtimes, "runsc")
	o := sandboxOptions()
	o.HostConfig.Runtime = "runsc"
	s, err := runcOnly.specFor(o, imageInfo{}, "x")
	wantUnsupported(t, s, err, "Runtime")
}

// The populate container the broker creates, never to start it, is
// accepted; its spec (a volume mounted read-write, no limits, no filter)
// could never start a task.
func TestPopulateContainerNeverStarts(t *testing.T) {
	o := client.ContainerCreateOptions{
		Name:   "sandboxd-populate-0123456789ab",
		Config: &container.Config{Image: "sha256:" + strings.Repeat("a", 64), Entrypoint: []string{"/nonexistent"}},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: "b-input-2", Target: "/v", VolumeOptions: &mount.VolumeOptions{NoCopy: true}}},
		},
	}
	e := testEngine()
	s, err := e.specFor(o, imageInfo{}, "sandboxd-populate-0123456789ab")
	if err != nil {
		t.Fatalf("the populate container is refused: %v", err)
	}
	if c := s.Process.Capabilities; len(c.Bounding)+len(c.Effective)+len(c.Permitted) != 0 {
		t.Errorf("capabilities %+v, want none", c)
	}
	if err := checkSandboxSpec(e, s); err == nil {
		t.Error("the populate container's spec passes the sandbox check: a task could start from it")
	}
}

// Every setting the broker never asks for is refused by name (the
// settings of TestUnsupportedSettingsAreRefused are not repeated).
func TestSpecForRefusesOtherSettings(t *testing.T) {
	for _, tc := range []struct {
		setting string
		change  func(*client.ContainerCreateOptions)
	}{
		{"HostConfig", func(o *client.ContainerCreateOptions) { o.HostConfig = nil }},
		{"HostConfig", func(o *client.ContainerCreateOptions) { o.Config = nil }},
		{"NetworkMode", func(o *client.ContainerCreateOptions) { o.HostConfig.NetworkMode = "" }},
		{"NetworkMode", func(o *client.ContainerCreateOptions) { o.HostConfig.NetworkMode = "host" }},
		{"NetworkMode", func(o *client.ContainerCreateOptions) { o.HostConfig.NetworkMode = "container:other" }},
		{"UTSMode", func(o *client.ContainerCreateOptions) { o.HostConfig.UTSMode = "host" }},
		{"UsernsMode", func(o *client.ContainerCreateOptions) { o.HostConfig.UsernsMode = "host" }},
		{"PidMode", func(o *client.ContainerCreateOptions) { o.HostConfig.PidMode = "container:other" }},
		{"IpcMode", func(o *client.ContainerCreateOptions) { o.HostConfig.IpcMode = container.IPCModePrivate }},
		{"IpcMode", func(o *client.ContainerCreateOptions) { o.HostConfig.IpcMode = container.IPCModeShareable }},
		{"VolumesFrom", func(o *client.ContainerCreateOptions) { o.HostConfig.VolumesFrom = []string{"other"} }},
		{"Links", func(o *client.ContainerCreateOptions) { o.HostConfig.Links = []string{"other:db"} }},
		{"PortBindings", func(o *client.ContainerCreateOptions) {
			o.HostConfig.PortBindings = network.PortMap{network.MustParsePort("80/tcp"): {{HostPort: "8080"}}}
		}},
		{"PublishAllPorts", func(o *client.ContainerCreateOptions) { o.HostConfig.PublishAllPorts = true }},
		{"ExtraHosts", func(o *client.ContainerCreateOptions) { o.HostConfig.ExtraHosts = []string{"a:10.0.0.1"} }},
		{"DnsOptions", func(o *client.ContainerCreateOptions) { o.HostConfig.DNSOptions = []string{"ndots:1"} }},
		{"DnsSearch", func(o *client.ContainerCreateOptions) { o.HostConfig.DNSSearch = []string{"example.com"} }},
		{"Dns", func(o *client.ContainerCreateOptions) {
			o.HostConfig.DNS = append(o.HostConfig.DNS, netip.MustParseAddr("127.0.0.1"))
		}},
		{"DeviceRequests", func(o *client.ContainerCreateOptions) {
			o.HostConfig.DeviceRequests = []container.DeviceRequest{{Driver: "nvidia", Count: -1}}
		}},
		{"DeviceCgroupRules", func(o *client.ContainerCreateOptions) { o.HostConfig.DeviceCgroupRules = []string{"c 1:11 rwm"} }},
		{"Sysctls", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"}
		}},
		{"GroupAdd", func(o *client.ContainerCreateOptions) { o.HostConfig.GroupAdd = []string{"0"} }},
		{"RestartPolicy", func(o *client.ContainerCreateOptions) {
			o.HostConfig.RestartPolicy.Name = container.RestartPolicyAlways
		}},
		{"AutoRemove", func(o *client.ContainerCreateOptions) { o.HostConfig.AutoRemove = true }},
		{"SecurityOpt", func(o *client.ContainerCreateOptions) {
			o.HostConfig.SecurityOpt = append(o.HostConfig.SecurityOpt, "no-new-privileges:false")
		}},
		{"SecurityOpt", func(o *client.ContainerCreateOptions) {
			o.HostConfig.SecurityOpt = append(o.HostConfig.SecurityOpt, "label=disable")
		}},
		{"Entrypoint", func(o *client.ContainerCreateOptions) { o.Config.Entrypoint, o.Config.Cmd = nil, nil }},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			o := sandboxOptions()
			tc.change(&o)
			s, err := testEngine().specFor(o, imageInfo{}, "x")
			wantUnsupported(t, s, err, tc.setting)
		})
	}
}

// wantUnsupported fails unless specFor refused, with no spec, naming
// setting.
func wantUnsupported(t *testing.T, s *specs.Spec, err error, setting string) {
	t.Helper()
	var ue *UnsupportedError
	if s != nil || !errors.As(err, &ue) || ue.Setting != setting {
		t.Errorf("got spec %v, error %v; want no spec and an UnsupportedError naming %s", s != nil, err, setting)
	}
}
