package containerdengine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/broker"
)

// recordFor is the containerd record ContainerCreate writes for o: the
// spec as containerd stores it (typeurl, JSON), the engine's labels beside
// the broker's, the runc shim's options selecting the runtime's binary,
// and the image's shared root view.
func recordFor(t *testing.T, e *Engine, o client.ContainerCreateOptions) containers.Container {
	t.Helper()
	name := strings.TrimPrefix(o.Name, "/")
	s, err := e.specFor(o, imageInfo{id: o.Config.Image, env: []string{"PATH=/bin"}}, name)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := typeurl.MarshalAny(s)
	if err != nil {
		t.Fatal(err)
	}
	rt := o.HostConfig.Runtime
	if rt == "" {
		rt = "runc"
	}
	ropts := &options.Options{}
	if bin := e.runtimes[rt]; bin != "runc" {
		ropts.BinaryName = bin
	}
	shimOpts, err := typeurl.MarshalAny(ropts)
	if err != nil {
		t.Fatal(err)
	}
	logCfg, err := json.Marshal(o.HostConfig.LogConfig)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{labelName: name, labelImage: o.Config.Image, labelRuntime: rt, labelLog: string(logCfg)}
	for k, v := range o.Config.Labels {
		labels[k] = v
	}
	if len(o.HostConfig.DNS) == 1 {
		labels[labelDNS] = o.HostConfig.DNS[0].String()
	}
	if o.Config.OpenStdin {
		labels[labelStdin] = "open"
	}
	view, _, _ := rootfsView(o.Config.Image, mountTargets(s), resolverOf(o.HostConfig))
	return containers.Container{ID: name, Labels: labels, Spec: spec, Runtime: containers.RuntimeInfo{Name: runcShim, Options: shimOpts},
		Snapshotter: e.cfg.Snapshotter, SnapshotKey: view}
}

// inspectRecord is ContainerInspect's translation of a record, without the
// task's state: decode the spec, name the runtime, map to Docker's fields.
func inspectRecord(t *testing.T, e *Engine, info containers.Container) (*specs.Spec, container.InspectResponse) {
	t.Helper()
	s, err := specOf(info)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := e.runtimeOf(info.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	return s, e.inspectOf(s, info.Labels, rt)
}

// Create options → the record containerd stores → Docker's inspect: every
// field the broker compares reads back as it asked, through the JSON form
// containerd holds; and the read-back spec passes the security check
// exactly when the options were the sandbox's.
func TestInspectReadsBackTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*client.ContainerCreateOptions)
		secure bool // the sandbox's settings: the check passes
	}{
		{"the sandbox on runc", func(*client.ContainerCreateOptions) {}, true},
		{"the sandbox on runsc", func(o *client.ContainerCreateOptions) { o.HostConfig.Runtime = "runsc" }, true},
		{"the sandbox with other limits", func(o *client.ContainerCreateOptions) {
			r := &o.HostConfig.Resources
			r.Memory, r.MemorySwap, r.NanoCPUs, r.PidsLimit = 512<<20, 512<<20, 250_000_000, i64(7)
			o.HostConfig.OomScoreAdj = 500
			o.HostConfig.Ulimits[2] = &container.Ulimit{Name: "nofile", Soft: 64, Hard: 128}
		}, true},
		{"the sandbox as nobody, one capability", func(o *client.ContainerCreateOptions) {
			o.Config.User = "65534:65534"
			o.HostConfig.CapAdd = []string{"CAP_SETUID"}
		}, true},
		{"no seccomp filter", func(o *client.ContainerCreateOptions) { o.HostConfig.SecurityOpt = []string{"no-new-privileges:true"} }, false},
		{"no no-new-privileges", func(o *client.ContainerCreateOptions) {
			o.HostConfig.SecurityOpt = o.HostConfig.SecurityOpt[1:]
		}, false},
		{"a writable root", func(o *client.ContainerCreateOptions) { o.HostConfig.ReadonlyRootfs = false }, false},
		{"a writable volume", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeVolume, Source: "b-out-3", Target: "/out",
				VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
		}, false},
		{"no pids limit", func(o *client.ContainerCreateOptions) { o.HostConfig.PidsLimit = nil }, false},
		{"no resolver, stdin closed", func(o *client.ContainerCreateOptions) {
			o.HostConfig.DNS = nil
			o.Config.OpenStdin, o.Config.StdinOnce, o.Config.AttachStdin = false, false, false
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testEngine()
			o := sandboxOptions()
			tc.change(&o)
			s, got := inspectRecord(t, e, recordFor(t, e, o))
			if err := checkSandboxSpec(e, s); (err == nil) != tc.secure {
				t.Errorf("security check of the read-back spec: got %v, want passing %v", err, tc.secure)
			}
			w, hc, cfg := o.HostConfig, got.HostConfig, got.Config
			wantRuntime := w.Runtime
			if wantRuntime == "" {
				wantRuntime = "runc"
			}
			var wantPoints []container.MountPoint
			for _, dst := range sortedKeys(w.Tmpfs) {
				wantPoints = append(wantPoints, container.MountPoint{Type: mount.TypeTmpfs, Destination: dst, RW: true})
			}
			for _, m := range w.Mounts {
				dir, err := e.volumeData(m.Source)
				if err != nil {
					t.Fatal(err)
				}
				wantPoints = append(wantPoints, container.MountPoint{Type: mount.TypeVolume, Name: m.Source, Source: dir, Destination: m.Target, RW: !m.ReadOnly})
			}
			for _, c := range []struct {
				name      string
				got, want any
			}{
				{"Privileged", hc.Privileged, false},
				{"CapDrop", hc.CapDrop, []string{"ALL"}},
				{"CapAdd", hc.CapAdd, w.CapAdd},
				{"SecurityOpt", hc.SecurityOpt, w.SecurityOpt},
				{"ReadonlyRootfs", hc.ReadonlyRootfs, w.ReadonlyRootfs},
				{"NetworkMode", hc.NetworkMode, w.NetworkMode},
				{"Dns", hc.DNS, w.DNS},
				{"IpcMode", hc.IpcMode, w.IpcMode},
				{"CgroupnsMode", hc.CgroupnsMode, w.CgroupnsMode},
				{"PidMode", hc.PidMode, w.PidMode},
				{"UTSMode", hc.UTSMode, w.UTSMode},
				{"UsernsMode", hc.UsernsMode, w.UsernsMode},
				{"Memory", hc.Memory, w.Memory},
				{"MemorySwap", hc.MemorySwap, w.MemorySwap},
				{"NanoCPUs", hc.NanoCPUs, w.NanoCPUs},
				{"PidsLimit", hc.PidsLimit, w.PidsLimit},
				{"OomScoreAdj", hc.OomScoreAdj, w.OomScoreAdj},
				{"Ulimits", fmt.Sprint(hc.Ulimits), fmt.Sprint(w.Ulimits)},
				{"Tmpfs", hc.Tmpfs, w.Tmpfs},
				{"Mounts", hc.Mounts, w.Mounts},
				{"mount points", got.Mounts, wantPoints},
				{"Binds", hc.Binds, w.Binds},
				{"Devices", len(hc.Devices) + len(hc.DeviceCgroupRules), 0},
				{"Sysctls", hc.Sysctls, w.Sysctls},
				{"GroupAdd", hc.GroupAdd, w.GroupAdd},
				{"Init", *hc.Init, *w.Init},
				{"LogConfig", hc.LogConfig, w.LogConfig},
				{"Runtime", hc.Runtime, wantRuntime},
				{"User", cfg.User, o.Config.User},
				{"Entrypoint", []string(cfg.Entrypoint), append(slices.Clone([]string(o.Config.Entrypoint)), o.Config.Cmd...)},
				{"WorkingDir", cfg.WorkingDir, o.Config.WorkingDir},
				{"Hostname", cfg.Hostname, o.Config.Hostname},
				{"Tty", cfg.Tty, o.Config.Tty},
				{"OpenStdin", cfg.OpenStdin, o.Config.OpenStdin},
				{"StdinOnce", cfg.StdinOnce, o.Config.StdinOnce},
				{"Labels", cfg.Labels, o.Config.Labels},
				{"Image", got.Image, o.Config.Image},
				{"config Image", cfg.Image, o.Config.Image},
				{"Path", got.Path, o.Config.Entrypoint[0]},
			} {
				if !equivalent(c.got, c.want) {
					t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
				}
			}
			for _, p := range dockerMasked {
				if !slices.Contains(hc.MaskedPaths, p) {
					t.Errorf("MaskedPaths %v lack %s", hc.MaskedPaths, p)
				}
			}
			for _, p := range dockerReadonly {
				if !slices.Contains(hc.ReadonlyPaths, p) {
					t.Errorf("ReadonlyPaths %v lack %s", hc.ReadonlyPaths, p)
				}
			}
		})
	}
}

// dockerMasked and dockerReadonly are the paths Docker masks and makes
// read-only in every container (moby's oci defaults).
var (
	dockerMasked = []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/scsi",
		"/proc/acpi", "/proc/asound", "/proc/latency_stats", "/proc/timer_stats", "/sys/firmware", "/sys/devices/virtual/powercap"}
	dockerReadonly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// equivalent is reflect.DeepEqual, except that a nil and an empty slice or
// map are the same (JSON drops empty fields of the spec), and pointers
// compare what they point to.
func equivalent(got, want any) bool {
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	if g.IsValid() && w.IsValid() && g.Type() == w.Type() {
		switch g.Kind() {
		case reflect.Slice, reflect.Map:
			if g.Len() == 0 && w.Len() == 0 {
				return true
			}
		case reflect.Pointer:
			if g.IsNil() || w.IsNil() {
				return g.IsNil() == w.IsNil()
			}
			return equivalent(g.Elem().Interface(), w.Elem().Interface())
		}
	}
	return reflect.DeepEqual(got, want)
}

// What containerd holds is what inspect reports: a spec weaker than the
// sandbox's in any security field reads back different from the
// sandbox's in the field the broker compares, so its comparison catches it.
func TestInspectReportsAWeakerSpec(t *testing.T) {
	e := testEngine()
	hc := func(f func(*container.HostConfig) any) func(container.InspectResponse) any {
		return func(r container.InspectResponse) any { return f(r.HostConfig) }
	}
	volRoot := e.cfg.StateDir + "/volumes/"
	for _, tc := range []struct {
		name   string
		weaken func(*specs.Spec)
		field  func(container.InspectResponse) any
	}{
		{"network namespace joined", func(s *specs.Spec) { s.Linux.Namespaces[4].Path = "/proc/1/ns/net" },
			hc(func(h *container.HostConfig) any { return h.NetworkMode })},
		{"no network namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 4, 5) },
			hc(func(h *container.HostConfig) any { return h.NetworkMode })},
		// A hook shows in no inspect field: the hooks row refuses any
		// (TestSpecWithAnyHookIsRefused).
		{"no IPC namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 1, 2) },
			hc(func(h *container.HostConfig) any { return h.IpcMode })},
		{"a /dev/shm", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"size=64k"}})
		}, hc(func(h *container.HostConfig) any { return h.IpcMode })},
		{"no PID namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 0, 1) },
			hc(func(h *container.HostConfig) any { return h.PidMode })},
		{"no UTS namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 2, 3) },
			hc(func(h *container.HostConfig) any { return h.UTSMode })},
		{"no cgroup namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 5, 6) },
			hc(func(h *container.HostConfig) any { return h.CgroupnsMode })},
		{"a user namespace", func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		}, hc(func(h *container.HostConfig) any { return h.UsernsMode })},
		{"no mount namespace", func(s *specs.Spec) { s.Linux.Namespaces = slices.Delete(s.Linux.Namespaces, 3, 4) },
			hc(func(h *container.HostConfig) any { return h.CapAdd })},
		{"a capability more", func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		}, hc(func(h *container.HostConfig) any { return h.CapAdd })},
		{"no no-new-privileges", func(s *specs.Spec) { s.Process.NoNewPrivileges = false },
			hc(func(h *container.HostConfig) any { return h.SecurityOpt })},
		{"no seccomp filter", func(s *specs.Spec) { s.Linux.Seccomp = nil },
			hc(func(h *container.HostConfig) any { return h.SecurityOpt })},
		{"a seccomp rule less", func(s *specs.Spec) { s.Linux.Seccomp.Syscalls = s.Linux.Seccomp.Syscalls[1:] },
			hc(func(h *container.HostConfig) any { return h.SecurityOpt })},
		{"a seccomp filter allowing by default", func(s *specs.Spec) { s.Linux.Seccomp.DefaultAction = specs.ActAllow },
			hc(func(h *container.HostConfig) any { return h.SecurityOpt })},
		{"a writable root", func(s *specs.Spec) { s.Root.Readonly = false },
			hc(func(h *container.HostConfig) any { return h.ReadonlyRootfs })},
		{"no root", func(s *specs.Spec) { s.Root = nil },
			hc(func(h *container.HostConfig) any { return h.ReadonlyRootfs })},
		{"a path unmasked", func(s *specs.Spec) { s.Linux.MaskedPaths = slices.DeleteFunc(s.Linux.MaskedPaths, isKcore) },
			hc(func(h *container.HostConfig) any { return h.MaskedPaths })},
		{"a path writable", func(s *specs.Spec) { s.Linux.ReadonlyPaths = s.Linux.ReadonlyPaths[1:] },
			hc(func(h *container.HostConfig) any { return h.ReadonlyPaths })},
		{"no memory limit", func(s *specs.Spec) { s.Linux.Resources.Memory = nil },
			hc(func(h *container.HostConfig) any { return h.Memory })},
		{"unlimited swap", func(s *specs.Spec) { *s.Linux.Resources.Memory.Swap = -1 },
			hc(func(h *container.HostConfig) any { return h.MemorySwap })},
		{"no CPU quota", func(s *specs.Spec) { s.Linux.Resources.CPU = nil },
			hc(func(h *container.HostConfig) any { return h.NanoCPUs })},
		{"a CPU period of zero", func(s *specs.Spec) { *s.Linux.Resources.CPU.Period = 0 },
			hc(func(h *container.HostConfig) any { return h.NanoCPUs })},
		{"a doubled CPU quota", func(s *specs.Spec) { *s.Linux.Resources.CPU.Quota *= 2 },
			hc(func(h *container.HostConfig) any { return h.NanoCPUs })},
		{"no pids limit", func(s *specs.Spec) { s.Linux.Resources.Pids = nil },
			hc(func(h *container.HostConfig) any { return fmt.Sprint(h.PidsLimit) })},
		{"a raised pids limit", func(s *specs.Spec) { s.Linux.Resources.Pids.Limit *= 2 },
			hc(func(h *container.HostConfig) any { return *h.PidsLimit })},
		{"an rlimit less", func(s *specs.Spec) { s.Process.Rlimits = s.Process.Rlimits[1:] },
			hc(func(h *container.HostConfig) any { return fmt.Sprint(h.Ulimits) })},
		{"a raised rlimit", func(s *specs.Spec) { s.Process.Rlimits[2].Hard *= 2 },
			hc(func(h *container.HostConfig) any { return fmt.Sprint(h.Ulimits) })},
		{"a lower OOM score", func(s *specs.Spec) { s.Process.OOMScoreAdj = nil },
			hc(func(h *container.HostConfig) any { return h.OomScoreAdj })},
		{"a device", func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/kmsg", Type: "c", Major: 1, Minor: 11}}
		}, hc(func(h *container.HostConfig) any { return len(h.Devices) })},
		{"a device rule more", func(s *specs.Spec) {
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"})
		}, hc(func(h *container.HostConfig) any { return len(h.DeviceCgroupRules) })},
		{"a sysctl", func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.shm_rmid_forced": "0"} },
			hc(func(h *container.HostConfig) any { return len(h.Sysctls) })},
		{"a supplementary group", func(s *specs.Spec) { s.Process.User.AdditionalGids = []uint32{0} },
			hc(func(h *container.HostConfig) any { return h.GroupAdd })},
		{"another user", func(s *specs.Spec) { s.Process.User.UID = 1 },
			func(r container.InspectResponse) any { return r.Config.User }},
		{"a terminal", func(s *specs.Spec) { s.Process.Terminal = true },
			func(r container.InspectResponse) any { return r.Config.Tty }},
		{"a volume writable", func(s *specs.Spec) { s.Mounts[len(s.Mounts)-1].Options = []string{"rbind", "nosuid", "nodev", "rw"} },
			hc(func(h *container.HostConfig) any { return fmt.Sprint(h.Mounts) })},
		{"a host directory", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind", "ro"}})
		}, hc(func(h *container.HostConfig) any { return h.Binds })},
		{"a host directory named like a volume", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/x", Type: "bind", Source: volRoot + "../../../../etc/_data", Options: []string{"rbind", "ro"}})
		}, hc(func(h *container.HostConfig) any { return h.Binds })},
		{"a base mount changed", func(s *specs.Spec) { s.Mounts[4].Options = []string{"nosuid", "noexec", "nodev", "rw"} },
			hc(func(h *container.HostConfig) any { return h.Binds })},
		{"a tmpfs unbounded", func(s *specs.Spec) {
			i := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/tmp" })
			s.Mounts[i].Options = []string{"rw", "exec", "nosuid", "nodev"}
		}, hc(func(h *container.HostConfig) any { return h.Tmpfs })},
		{"another command", func(s *specs.Spec) { s.Process.Args = []string{"/bin/sh"} },
			func(r container.InspectResponse) any { return fmt.Sprint(r.Config.Entrypoint, *r.HostConfig.Init) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{labelImage: "sha256:" + strings.Repeat("a", 64)}
			asked := tc.field(e.inspectOf(sandboxSpec(t), labels, "runc"))
			s := sandboxSpec(t)
			tc.weaken(s)
			if got := tc.field(e.inspectOf(s, labels, "runc")); reflect.DeepEqual(got, asked) {
				t.Errorf("the weakened spec reads back as the sandbox's: %v", got)
			}
		})
	}
}

func isKcore(p string) bool { return p == "/proc/kcore" }

// A spec without process, linux or root section reads as nothing the
// sandbox asks for: the host's namespaces, no root protection, no filter,
// no limits, no init.
func TestInspectOfAnEmptySpec(t *testing.T) {
	e := testEngine()
	got := e.inspectOf(&specs.Spec{}, nil, "runc")
	asked := e.inspectOf(sandboxSpec(t), nil, "runc")
	h, a := got.HostConfig, asked.HostConfig
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"NetworkMode", h.NetworkMode, container.NetworkMode("host")},
		{"IpcMode", h.IpcMode, container.IpcMode("host")},
		{"PidMode", h.PidMode, container.PidMode("host")},
		{"UTSMode", h.UTSMode, container.UTSMode("host")},
		{"CgroupnsMode", h.CgroupnsMode, container.CgroupnsModeHost},
		{"ReadonlyRootfs", h.ReadonlyRootfs, false},
		{"SecurityOpt", len(h.SecurityOpt), 0},
		{"Memory", h.Memory, int64(0)},
		{"NanoCPUs", h.NanoCPUs, int64(0)},
		{"PidsLimit", h.PidsLimit == nil, true},
		{"Init", *h.Init, false},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if reflect.DeepEqual(h.CapAdd, a.CapAdd) {
		t.Errorf("CapAdd: got %v, the sandbox's: a spec without a mount namespace must not read as the sandbox's capabilities", h.CapAdd)
	}
}

// Labels: the broker sees its own labels, never the engine's; the
// resolver, stdin and log settings read back from the engine's labels.
func TestInspectOfLabels(t *testing.T) {
	e := testEngine()
	mine := map[string]string{broker.LabelRole: "job", broker.LabelJob: "j1"}
	labels := map[string]string{labelName: "n", labelImage: "sha256:" + strings.Repeat("b", 64), labelRuntime: "runc",
		labelDNS: "10.0.0.53", labelStdin: "open", labelStarted: "2024-01-01T00:00:00Z", labelLease: "n",
		labelLog: `{"Type":"local","Config":{"max-size":"1m"}}`}
	for k, v := range mine {
		labels[k] = v
	}
	got := e.inspectOf(sandboxSpec(t), labels, "runc")
	if !reflect.DeepEqual(got.Config.Labels, mine) {
		t.Errorf("labels: got %v, want the broker's own %v", got.Config.Labels, mine)
	}
	if got.Image != labels[labelImage] || got.Config.Image != labels[labelImage] {
		t.Errorf("image: got %s and %s, want %s", got.Image, got.Config.Image, labels[labelImage])
	}
	if d := got.HostConfig.DNS; len(d) != 1 || d[0].String() != labels[labelDNS] {
		t.Errorf("dns: got %v, want %s", d, labels[labelDNS])
	}
	if !got.Config.OpenStdin || !got.Config.StdinOnce {
		t.Errorf("stdin: got open %v once %v, want both", got.Config.OpenStdin, got.Config.StdinOnce)
	}
	if lc := got.HostConfig.LogConfig; lc.Type != "local" || lc.Config["max-size"] != "1m" {
		t.Errorf("log config: got %+v, want local with max-size 1m", lc)
	}
	bare := e.inspectOf(sandboxSpec(t), map[string]string{labelDNS: "not an address"}, "runc")
	if bare.HostConfig.DNS != nil || bare.Config.OpenStdin || len(bare.Config.Labels) != 0 || bare.HostConfig.LogConfig.Type != "" {
		t.Errorf("no usable labels: got dns %v, stdin %v, labels %v, log %+v; want none", bare.HostConfig.DNS, bare.Config.OpenStdin, bare.Config.Labels, bare.HostConfig.LogConfig)
	}
}

// The runtime is named by the binary the runc shim's options select: a
// binary the engine does not know never reads as runc or runsc, and a
// record on another shim, or with options it cannot read, is an error.
func TestRuntimeOf(t *testing.T) {
	e := testEngine()
	anyOf := func(v any) typeurl.Any {
		a, err := typeurl.MarshalAny(v)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name string
		info containers.RuntimeInfo
		want string // "" for an error
	}{
		{"no options", containers.RuntimeInfo{Name: runcShim}, "runc"},
		{"no binary", containers.RuntimeInfo{Name: runcShim, Options: anyOf(&options.Options{})}, "runc"},
		{"runc", containers.RuntimeInfo{Name: runcShim, Options: anyOf(&options.Options{BinaryName: e.runtimes["runc"]})}, "runc"},
		{"runsc", containers.RuntimeInfo{Name: runcShim, Options: anyOf(&options.Options{BinaryName: e.runtimes["runsc"]})}, "runsc"},
		{"another shim", containers.RuntimeInfo{Name: "io.containerd.runsc.v1"}, ""},
		{"other options", containers.RuntimeInfo{Name: runcShim, Options: anyOf(&options.CheckpointOptions{})}, ""},
		{"unreadable options", containers.RuntimeInfo{Name: runcShim, Options: rawAny{"types.example/unknown", []byte{1, 2}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.runtimeOf(tc.info)
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("got runtime %q, want an error", got)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	bin := "/usr/local/bin/crun"
	got, err := e.runtimeOf(containers.RuntimeInfo{Name: runcShim, Options: anyOf(&options.Options{BinaryName: bin})})
	if err != nil || !strings.Contains(got, bin) {
		t.Errorf("unknown binary: got %q, %v; want a name citing %s", got, err, bin)
	}
	if _, known := e.runtimes[got]; known {
		t.Errorf("unknown binary %s reads as the known runtime %q", bin, got)
	}
}

// rawAny is a typeurl.Any of any type URL and bytes.
type rawAny struct {
	url   string
	value []byte
}

func (a rawAny) GetTypeUrl() string { return a.url }
func (a rawAny) GetValue() []byte   { return a.value }

// A record without a spec, or with one that does not decode, is an error,
// never an empty (unconfined) spec.
func TestSpecOfRefusesABrokenRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec typeurl.Any
	}{
		{"no spec", nil},
		{"not JSON", rawAny{"types.containerd.io/opencontainers/runtime-spec/1/Spec", []byte("{")}},
		{"not a spec", rawAny{"types.containerd.io/opencontainers/runtime-spec/1/Spec", []byte(`{"process":"x"}`)}},
	} {
		if s, err := specOf(containers.Container{ID: "c", Spec: tc.spec}); err == nil || s != nil {
			t.Errorf("%s: got spec %v, error %v; want an error", tc.name, s != nil, err)
		}
	}
}
