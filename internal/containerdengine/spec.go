package containerdengine

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// What every sandbox gets that the create options do not name: the mounts
// and devices a Linux process needs, masked and read-only paths as Docker
// masks them (moby's oci defaults, plus powercap), and no more.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

	// baseMounts are the only mounts besides tmpfs scratch and volumes.
	// There is no /dev/shm (IpcMode none) and no engine-written
	// /etc/hosts, /etc/hostname or /etc/resolv.conf.
	baseMounts = []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}

	// deviceRules allow the devices runc creates in every container
	// (null, zero, full, random, urandom, tty, the pts instance and its
	// ptmx) and nothing else.
	deviceRules = []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(5), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(7), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(8), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(9), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(5), Minor: i64(0), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(5), Minor: i64(2), Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(136), Access: "rwm"},
	}

	sandboxNamespaces = []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
		{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.CgroupNamespace},
	}
)

func i64(v int64) *int64 { return &v }

// cpuPeriod is the CFS period NanoCPUs is expressed in, as Docker does.
const cpuPeriod = 100_000

// rlimitNames maps Docker's ulimit names to the OCI rlimit types.
var rlimitNames = map[string]string{
	"core": "RLIMIT_CORE", "fsize": "RLIMIT_FSIZE", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC",
	"cpu": "RLIMIT_CPU", "data": "RLIMIT_DATA", "stack": "RLIMIT_STACK", "memlock": "RLIMIT_MEMLOCK",
	"as": "RLIMIT_AS", "locks": "RLIMIT_LOCKS", "sigpending": "RLIMIT_SIGPENDING", "msgqueue": "RLIMIT_MSGQUEUE",
	"nice": "RLIMIT_NICE", "rtprio": "RLIMIT_RTPRIO", "rttime": "RLIMIT_RTTIME", "rss": "RLIMIT_RSS",
}

// UnsupportedError names a create option this engine cannot express: the
// container is refused, never created weaker.
type UnsupportedError struct {
	Setting string
	Value   string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("containerd engine: setting %s=%s cannot be applied by this engine", e.Setting, e.Value)
}

// specFor translates Docker create options into the OCI runtime spec of
// the container. It accepts exactly what the broker asks for (the
// sandbox's settings and the never-started populate container) and refuses
// every other setting by name.
func (e *Engine) specFor(opts client.ContainerCreateOptions, img imageInfo, id string) (*specs.Spec, error) {
	cfg, hc := opts.Config, opts.HostConfig
	if cfg == nil || hc == nil {
		return nil, &UnsupportedError{Setting: "HostConfig", Value: "missing"}
	}
	refuse := func(setting string, bad bool, v any) error {
		if bad {
			return &UnsupportedError{Setting: setting, Value: fmt.Sprint(v)}
		}
		return nil
	}
	if err := firstErr(
		refuse("Privileged", hc.Privileged, hc.Privileged),
		refuse("NetworkMode", hc.NetworkMode != "none", hc.NetworkMode),
		refuse("PidMode", hc.PidMode != "", hc.PidMode),
		refuse("UTSMode", hc.UTSMode != "", hc.UTSMode),
		refuse("UsernsMode", hc.UsernsMode != "", hc.UsernsMode),
		refuse("IpcMode", hc.IpcMode != "" && hc.IpcMode != container.IPCModeNone, hc.IpcMode),
		refuse("CgroupnsMode", hc.CgroupnsMode != "" && hc.CgroupnsMode != container.CgroupnsModePrivate, hc.CgroupnsMode),
		refuse("Binds", len(hc.Binds) > 0, hc.Binds),
		refuse("VolumesFrom", len(hc.VolumesFrom) > 0, hc.VolumesFrom),
		refuse("Links", len(hc.Links) > 0, hc.Links),
		refuse("PortBindings", len(hc.PortBindings) > 0, hc.PortBindings),
		refuse("PublishAllPorts", hc.PublishAllPorts, hc.PublishAllPorts),
		refuse("ExtraHosts", len(hc.ExtraHosts) > 0, hc.ExtraHosts),
		refuse("DnsOptions", len(hc.DNSOptions) > 0, hc.DNSOptions),
		refuse("DnsSearch", len(hc.DNSSearch) > 0, hc.DNSSearch),
		refuse("Dns", len(hc.DNS) > 1 || (len(hc.DNS) == 1 && hc.DNS[0].String() != "127.0.0.1"), hc.DNS),
		refuse("Devices", len(hc.Devices) > 0, hc.Devices),
		refuse("DeviceRequests", len(hc.DeviceRequests) > 0, hc.DeviceRequests),
		refuse("DeviceCgroupRules", len(hc.DeviceCgroupRules) > 0, hc.DeviceCgroupRules),
		refuse("Sysctls", len(hc.Sysctls) > 0, hc.Sysctls),
		refuse("GroupAdd", len(hc.GroupAdd) > 0, hc.GroupAdd),
		refuse("RestartPolicy", hc.RestartPolicy.Name != "" && hc.RestartPolicy.Name != container.RestartPolicyDisabled, hc.RestartPolicy.Name),
		refuse("AutoRemove", hc.AutoRemove, hc.AutoRemove),
		refuse("LogConfig", hc.LogConfig.Type != "" && hc.LogConfig.Type != "local", hc.LogConfig.Type),
		refuse("Tty", cfg.Tty, cfg.Tty),
		refuse("Runtime", hc.Runtime != "" && e.runtimes[hc.Runtime] == "", hc.Runtime),
	); err != nil {
		return nil, err
	}

	uid, gid, err := parseUser(cfg.User)
	if err != nil {
		return nil, err
	}
	caps, err := capSet(hc.CapDrop, hc.CapAdd)
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone([]string(cfg.Entrypoint)), cfg.Cmd...)
	if len(args) == 0 {
		return nil, &UnsupportedError{Setting: "Entrypoint", Value: "empty"}
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: cfg.Hostname,
		Root:     &specs.Root{Path: "rootfs", Readonly: hc.ReadonlyRootfs},
		Process: &specs.Process{
			User:            specs.User{UID: uid, GID: gid},
			Args:            args,
			Env:             processEnv(img.env, cfg.Env, cfg.Hostname),
			Cwd:             orDefault(cfg.WorkingDir, "/"),
			NoNewPrivileges: slices.Contains(hc.SecurityOpt, "no-new-privileges:true"),
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
				Inheritable: []string{}, Ambient: []string{},
			},
		},
		Mounts: slices.Clone(baseMounts),
		Linux: &specs.Linux{
			Namespaces:    slices.Clone(sandboxNamespaces),
			MaskedPaths:   slices.Clone(maskedPaths),
			ReadonlyPaths: slices.Clone(readonlyPaths),
			CgroupsPath:   "/" + e.cfg.Namespace + "/" + id,
			Resources: &specs.LinuxResources{
				Devices: slices.Clone(deviceRules),
			},
		},
	}
	if hc.OomScoreAdj != 0 {
		s.Process.OOMScoreAdj = &hc.OomScoreAdj
	}
	r := s.Linux.Resources
	if hc.Memory > 0 {
		mem := &specs.LinuxMemory{Limit: i64(hc.Memory)}
		if hc.MemorySwap != 0 {
			mem.Swap = i64(hc.MemorySwap)
		}
		r.Memory = mem
	}
	if hc.NanoCPUs > 0 {
		quota := hc.NanoCPUs * cpuPeriod / 1e9
		period := uint64(cpuPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if hc.PidsLimit != nil && *hc.PidsLimit > 0 {
		r.Pids = &specs.LinuxPids{Limit: *hc.PidsLimit}
	}
	for _, u := range hc.Ulimits {
		t, ok := rlimitNames[u.Name]
		if !ok {
			return nil, &UnsupportedError{Setting: "Ulimits", Value: u.Name}
		}
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: t, Soft: uint64(u.Soft), Hard: uint64(u.Hard)})
	}
	for _, opt := range hc.SecurityOpt {
		switch {
		case opt == "no-new-privileges:true":
		case strings.HasPrefix(opt, "seccomp="):
			sc, err := mobyseccomp.LoadProfile(strings.TrimPrefix(opt, "seccomp="), s)
			if err != nil {
				return nil, fmt.Errorf("containerd engine: seccomp profile: %w", err)
			}
			s.Linux.Seccomp = sc
		default:
			return nil, &UnsupportedError{Setting: "SecurityOpt", Value: opt}
		}
	}
	// Scratch tmpfs, then volumes, each at its own target.
	for _, dst := range sortedKeys(hc.Tmpfs) {
		if err := checkTarget(dst); err != nil {
			return nil, err
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "tmpfs", Source: "tmpfs", Options: strings.Split(hc.Tmpfs[dst], ",")})
	}
	for _, m := range hc.Mounts {
		if m.Type != mount.TypeVolume {
			return nil, &UnsupportedError{Setting: "Mounts", Value: string(m.Type) + " at " + m.Target}
		}
		if err := checkTarget(m.Target); err != nil {
			return nil, err
		}
		dir, err := e.volumeData(m.Source)
		if err != nil {
			return nil, err
		}
		o := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			o = append(o, "ro")
		} else {
			o = append(o, "rw")
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: dir, Options: o})
	}
	// No hooks (s.Hooks stays nil): a hook runs on the host, as root,
	// outside every row of the table. The new network namespace (network
	// none) holds only lo, and the runtime brings it up itself, as Docker's
	// none network has it: runc's libcontainer adds a loopback network to a
	// spec that asks a new network namespace without a path, and gVisor's
	// netstack has its own lo.
	return s, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func checkTarget(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return &UnsupportedError{Setting: "Mounts", Value: "target " + p}
	}
	for _, m := range baseMounts {
		if p == m.Destination || strings.HasPrefix(p, m.Destination+"/") {
			return &UnsupportedError{Setting: "Mounts", Value: "target " + p}
		}
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// processEnv is the image's environment, then the container's, then
// HOSTNAME, as Docker builds it.
func processEnv(image, env []string, hostname string) []string {
	out := map[string]string{}
	var order []string
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := out[k]; !ok {
			order = append(order, k)
		}
		out[k] = kv
	}
	for _, kv := range image {
		set(kv)
	}
	if hostname != "" {
		set("HOSTNAME=" + hostname)
	}
	for _, kv := range env {
		set(kv)
	}
	list := make([]string, 0, len(order))
	for _, k := range order {
		list = append(list, out[k])
	}
	return list
}

func parseUser(u string) (uint32, uint32, error) {
	if u == "" {
		return 0, 0, nil
	}
	var uid, gid uint32
	if _, err := fmt.Sscanf(u, "%d:%d", &uid, &gid); err != nil || fmt.Sprintf("%d:%d", uid, gid) != u {
		return 0, 0, &UnsupportedError{Setting: "User", Value: u}
	}
	return uid, gid, nil
}

// capSet is the capability set of CapDrop ALL plus CapAdd; any other drop
// list would need the engine's default set, which this engine does not
// have.
func capSet(drop, add []string) ([]string, error) {
	if len(drop) == 0 && len(add) == 0 {
		return []string{}, nil // the populate container never starts
	}
	if !slices.Equal(drop, []string{"ALL"}) {
		return nil, &UnsupportedError{Setting: "CapDrop", Value: fmt.Sprint(drop)}
	}
	out := make([]string, 0, len(add))
	for _, c := range add {
		c = strings.ToUpper(c)
		if !strings.HasPrefix(c, "CAP_") {
			c = "CAP_" + c
		}
		if c == "CAP_ALL" {
			return nil, &UnsupportedError{Setting: "CapAdd", Value: c}
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
