package containerdengine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
)

// ContainerInspect reads the container back from containerd and reports
// it as Docker's inspect does: every security field comes from the OCI
// spec containerd holds (what the runtime will apply), not from what was
// asked, so the broker's own comparison applies unchanged.
func (e *Engine) ContainerInspect(ctx context.Context, id string, _ client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.ContainerInspectResult{}, err
	}
	info, err := infoOf(ctx, c)
	if err != nil {
		return client.ContainerInspectResult{}, err
	}
	spec, err := specOf(info)
	if err != nil {
		return client.ContainerInspectResult{}, err
	}
	runtime, err := e.runtimeOf(info.Runtime)
	if err != nil {
		return client.ContainerInspectResult{}, err
	}
	insp := e.inspectOf(spec, info.Labels, runtime)
	insp.ID = info.ID
	insp.Name = "/" + info.Labels[labelName]
	insp.Created = info.CreatedAt.UTC().Format(time.RFC3339Nano)
	if insp.State, err = e.state(ctx, info); err != nil {
		return client.ContainerInspectResult{}, err
	}
	return client.ContainerInspectResult{Container: insp}, nil
}

// runtimeOf names the job runtime a container's runtime options select.
func (e *Engine) runtimeOf(r containers.RuntimeInfo) (string, error) {
	if r.Name != runcShim {
		return "", fmt.Errorf("container runtime %s is not %s", r.Name, runcShim)
	}
	bin := "runc"
	if r.Options != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return "", fmt.Errorf("container runtime options: %w", err)
		}
		o, ok := v.(*options.Options)
		if !ok {
			return "", fmt.Errorf("container runtime options are %T", v)
		}
		if o.BinaryName != "" {
			bin = o.BinaryName
		}
	}
	for name, b := range e.runtimes {
		if b == bin {
			return name, nil
		}
	}
	return "binary " + bin, nil
}

// inspectOf maps an OCI spec onto Docker's inspect fields.
func (e *Engine) inspectOf(s *specs.Spec, labels map[string]string, runtime string) container.InspectResponse {
	p := s.Process
	if p == nil {
		p = &specs.Process{}
	}
	l := s.Linux
	if l == nil {
		l = &specs.Linux{}
	}
	res := l.Resources
	if res == nil {
		res = &specs.LinuxResources{}
	}
	hc := &container.HostConfig{
		Runtime:        runtime,
		ReadonlyRootfs: s.Root != nil && s.Root.Readonly,
		MaskedPaths:    slices.Clone(l.MaskedPaths),
		ReadonlyPaths:  slices.Clone(l.ReadonlyPaths),
		RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Tmpfs:          map[string]string{},
	}
	if lc := labels[labelLog]; lc != "" {
		json.Unmarshal([]byte(lc), &hc.LogConfig)
	}
	if d := labels[labelDNS]; d != "" {
		if a, err := netip.ParseAddr(d); err == nil {
			hc.DNS = []netip.Addr{a}
		}
	}
	// Capabilities: the bounding set is what any process can ever hold.
	var caps []string
	if p.Capabilities != nil {
		caps = slices.Clone(p.Capabilities.Bounding)
	}
	hc.CapDrop = []string{"ALL"}
	hc.CapAdd = caps
	if p.NoNewPrivileges {
		hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
	}
	if l.Seccomp != nil {
		hc.SecurityOpt = append(hc.SecurityOpt, "seccomp="+seccompName(s))
	}
	// Namespaces: Docker's names for what the spec asks.
	ns := map[specs.LinuxNamespaceType]string{}
	for _, n := range l.Namespaces {
		ns[n.Type] = "new"
		if n.Path != "" {
			ns[n.Type] = "path " + n.Path
		}
	}
	hasShm := slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev/shm" })
	hc.NetworkMode = "host"
	if ns[specs.NetworkNamespace] == "new" {
		// A new namespace holds only lo, which the runtime brings up: Docker's
		// none. (Hooks, which could add to it from the host, are refused by
		// checkSandboxSpec.)
		hc.NetworkMode = "none"
	} else if ns[specs.NetworkNamespace] != "" {
		hc.NetworkMode = container.NetworkMode("container:" + ns[specs.NetworkNamespace])
	}
	hc.IpcMode = "host"
	if ns[specs.IPCNamespace] == "new" && !hasShm {
		hc.IpcMode = container.IPCModeNone
	} else if ns[specs.IPCNamespace] == "new" {
		hc.IpcMode = container.IPCModePrivate
	}
	hc.CgroupnsMode = container.CgroupnsModeHost
	if ns[specs.CgroupNamespace] == "new" {
		hc.CgroupnsMode = container.CgroupnsModePrivate
	}
	modeOf := func(t specs.LinuxNamespaceType) string {
		if ns[t] == "new" {
			return ""
		}
		return "host"
	}
	hc.PidMode = container.PidMode(modeOf(specs.PIDNamespace))
	hc.UTSMode = container.UTSMode(modeOf(specs.UTSNamespace))
	if ns[specs.UserNamespace] != "" {
		hc.UsernsMode = container.UsernsMode(ns[specs.UserNamespace])
	}
	if ns[specs.MountNamespace] != "new" {
		hc.CapAdd = append(hc.CapAdd, "NO_MOUNT_NAMESPACE") // never matches: fails the caps row
	}
	// Resources.
	if res.Memory != nil {
		if res.Memory.Limit != nil {
			hc.Memory = *res.Memory.Limit
		}
		if res.Memory.Swap != nil {
			hc.MemorySwap = *res.Memory.Swap
		}
	}
	if res.CPU != nil && res.CPU.Quota != nil && res.CPU.Period != nil && *res.CPU.Period > 0 {
		hc.NanoCPUs = *res.CPU.Quota * 1e9 / int64(*res.CPU.Period)
	}
	if res.Pids != nil {
		v := res.Pids.Limit
		hc.PidsLimit = &v
	}
	if p.OOMScoreAdj != nil {
		hc.OomScoreAdj = *p.OOMScoreAdj
	}
	for _, r := range p.Rlimits {
		name := strings.ToLower(strings.TrimPrefix(r.Type, "RLIMIT_"))
		hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: name, Soft: int64(r.Soft), Hard: int64(r.Hard)})
	}
	for _, d := range l.Devices {
		hc.Devices = append(hc.Devices, container.DeviceMapping{PathOnHost: "?", PathInContainer: d.Path, CgroupPermissions: d.Type})
	}
	if !reflect.DeepEqual(res.Devices, deviceRules) {
		for _, d := range res.Devices {
			hc.DeviceCgroupRules = append(hc.DeviceCgroupRules, fmt.Sprintf("%v %s %s", d.Allow, d.Type, d.Access))
		}
	}
	if len(l.Sysctl) > 0 {
		hc.Sysctls = l.Sysctl
	}
	// Mounts: scratch tmpfs and volumes as Docker names them; the base
	// mounts every container has are checked by checkSandboxSpec; any
	// other mount is reported as a bind of its host source.
	var points []container.MountPoint
	volRoot := filepath.Join(e.cfg.StateDir, "volumes") + "/"
	for _, m := range s.Mounts {
		if slices.ContainsFunc(baseMounts, func(b specs.Mount) bool { return reflect.DeepEqual(b, m) }) {
			continue
		}
		ro := slices.Contains(m.Options, "ro")
		switch {
		case m.Type == "tmpfs":
			hc.Tmpfs[m.Destination] = strings.Join(m.Options, ",")
			points = append(points, container.MountPoint{Type: mount.TypeTmpfs, Destination: m.Destination, RW: !ro})
		case m.Type == "bind" && strings.HasPrefix(m.Source, volRoot) && strings.HasSuffix(m.Source, "/_data") &&
			!strings.Contains(strings.TrimSuffix(strings.TrimPrefix(m.Source, volRoot), "/_data"), "/"):
			name := strings.TrimSuffix(strings.TrimPrefix(m.Source, volRoot), "/_data")
			hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeVolume, Source: name, Target: m.Destination, ReadOnly: ro,
				VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
			points = append(points, container.MountPoint{Type: mount.TypeVolume, Name: name, Source: m.Source, Destination: m.Destination, RW: !ro})
		default:
			hc.Binds = append(hc.Binds, m.Source+":"+m.Destination)
			points = append(points, container.MountPoint{Type: mount.TypeBind, Source: m.Source, Destination: m.Destination, RW: !ro})
		}
	}
	if len(hc.Tmpfs) == 0 {
		hc.Tmpfs = nil
	}
	init := len(p.Args) > 0 && p.Args[0] == helperPath // the helper is its own init (see package shim)
	hc.Init = &init
	cfg := &container.Config{
		Hostname:   s.Hostname,
		User:       strconv.FormatUint(uint64(p.User.UID), 10) + ":" + strconv.FormatUint(uint64(p.User.GID), 10),
		Env:        slices.Clone(p.Env),
		Entrypoint: slices.Clone(p.Args),
		WorkingDir: p.Cwd,
		Tty:        p.Terminal,
		Image:      labels[labelImage],
		Labels:     userLabels(labels),
		OpenStdin:  labels[labelStdin] == "open",
		StdinOnce:  labels[labelStdin] == "open",
	}
	if len(p.User.AdditionalGids) > 0 {
		for _, g := range p.User.AdditionalGids {
			hc.GroupAdd = append(hc.GroupAdd, strconv.FormatUint(uint64(g), 10))
		}
	}
	return container.InspectResponse{Image: labels[labelImage], Config: cfg, HostConfig: hc, Mounts: points, Path: first(p.Args)}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// helperPath is where the broker mounts its helper (package broker).
const helperPath = "/.sandboxd/shim"

// seccompName is the project profile's JSON if the spec's filter is exactly
// what that profile gives for this spec, else a name that matches nothing.
func seccompName(s *specs.Spec) string {
	want, err := mobyseccomp.LoadProfile(string(seccomp.JSON()), s)
	if err == nil && reflect.DeepEqual(want, s.Linux.Seccomp) {
		return string(seccomp.JSON())
	}
	b, _ := json.Marshal(s.Linux.Seccomp)
	return fmt.Sprintf("unknown filter of %d bytes", len(b))
}

// hookCount is how many hooks h holds, of every kind the spec names
// (prestart, createRuntime, createContainer, startContainer, poststart,
// poststop, and any list a later runtime-spec adds to Hooks).
func hookCount(h *specs.Hooks) int {
	if h == nil {
		return 0
	}
	n := 0
	v := reflect.ValueOf(*h)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Slice {
			n += f.Len()
		}
	}
	return n
}

// checkSandboxSpec checks a container's read-back OCI spec, before its task
// is made, against every row of the security table, independently of how
// it was made: a spec that fails a row is named and never run.
func checkSandboxSpec(e *Engine, s *specs.Spec) error {
	fail := func(row, want, got string) error {
		return &broker.SettingError{Setting: "oci." + row, Want: want, Got: got}
	}
	if s.Process == nil || s.Linux == nil || s.Root == nil {
		return fail("process/linux/root", "present", "missing")
	}
	p, l := s.Process, s.Linux
	var got []string
	for _, n := range l.Namespaces {
		if n.Path != "" {
			return fail("namespaces", "new", string(n.Type)+" at "+n.Path)
		}
		got = append(got, string(n.Type))
	}
	var want []string
	for _, n := range sandboxNamespaces {
		want = append(want, string(n.Type))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fail("namespaces", fmt.Sprint(want), fmt.Sprint(got))
	}
	if len(l.UIDMappings)+len(l.GIDMappings) > 0 {
		return fail("user namespace mappings", "none", "present")
	}
	// No hook of any kind, s.Hooks nil or every list empty: a hook runs on
	// the host, as root, around the sandbox, and no row bounds what it
	// does. This fails closed, as intended, on a container made by an older
	// sandboxd, whose spec carried the prestart hook `sandboxd-hook
	// loopback-up` (lo is the runtime's to bring up: specFor): such a
	// container never gets a task or an update from this engine.
	if n := hookCount(s.Hooks); n > 0 {
		return fail("hooks", "none", fmt.Sprintf("%d: %+v", n, *s.Hooks))
	}
	if !p.NoNewPrivileges {
		return fail("noNewPrivileges", "true", "false")
	}
	if p.Terminal {
		return fail("terminal", "false", "true")
	}
	c := p.Capabilities
	if c == nil || len(c.Inheritable)+len(c.Ambient) > 0 || !slices.Equal(c.Bounding, c.Effective) || !slices.Equal(c.Bounding, c.Permitted) ||
		slices.ContainsFunc(c.Bounding, func(x string) bool { return x != "CAP_SETGID" && x != "CAP_SETUID" }) {
		return fail("capabilities", "bounding=effective=permitted within [CAP_SETGID CAP_SETUID], no inheritable or ambient", fmt.Sprintf("%+v", c))
	}
	if !s.Root.Readonly {
		return fail("root.readonly", "true", "false")
	}
	if l.Seccomp == nil || seccompName(s) != string(seccomp.JSON()) {
		return fail("seccomp", "the project profile "+seccomp.Digest(), "another filter")
	}
	for _, m := range maskedPaths {
		if !slices.Contains(l.MaskedPaths, m) {
			return fail("maskedPaths", "includes "+m, fmt.Sprint(l.MaskedPaths))
		}
	}
	for _, m := range readonlyPaths {
		if !slices.Contains(l.ReadonlyPaths, m) {
			return fail("readonlyPaths", "includes "+m, fmt.Sprint(l.ReadonlyPaths))
		}
	}
	r := l.Resources
	switch {
	case r == nil || r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit <= 0:
		return fail("resources.memory.limit", "set", "unset")
	case r.Memory.Swap == nil || *r.Memory.Swap != *r.Memory.Limit:
		return fail("resources.memory.swap", "= limit", fmt.Sprint(r.Memory.Swap))
	case r.CPU == nil || r.CPU.Quota == nil || *r.CPU.Quota <= 0:
		return fail("resources.cpu.quota", "set", "unset")
	case r.Pids == nil || r.Pids.Limit <= 0:
		return fail("resources.pids.limit", "set", "unset")
	case !reflect.DeepEqual(r.Devices, deviceRules):
		return fail("resources.devices", "the minimal set", fmt.Sprint(r.Devices))
	case len(l.Devices) > 0:
		return fail("devices", "none", fmt.Sprint(l.Devices))
	case len(l.Sysctl) > 0:
		return fail("sysctl", "none", fmt.Sprint(l.Sysctl))
	}
	for _, name := range []string{"RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC"} {
		if !slices.ContainsFunc(p.Rlimits, func(x specs.POSIXRlimit) bool { return x.Type == name }) {
			return fail("rlimits", "includes "+name, fmt.Sprint(p.Rlimits))
		}
	}
	volRoot := filepath.Join(e.cfg.StateDir, "volumes") + "/"
	base := 0
	for _, m := range s.Mounts {
		switch {
		case slices.ContainsFunc(baseMounts, func(b specs.Mount) bool { return reflect.DeepEqual(b, m) }):
			base++
		case m.Type == "tmpfs" && slices.Contains(m.Options, "nosuid") && slices.Contains(m.Options, "nodev") &&
			slices.ContainsFunc(m.Options, func(o string) bool { return strings.HasPrefix(o, "size=") }):
		case m.Type == "bind" && strings.HasPrefix(m.Source, volRoot) && slices.Contains(m.Options, "ro") && slices.Contains(m.Options, "nosuid"):
		default:
			return fail("mounts", "base mounts, bounded tmpfs and read-only volumes", fmt.Sprintf("%s %s from %s %v", m.Type, m.Destination, m.Source, m.Options))
		}
		if m.Destination == "/etc/hosts" || m.Destination == "/etc/hostname" || m.Destination == "/etc/resolv.conf" || m.Destination == "/dev/shm" {
			return fail("mounts", "no engine-written "+m.Destination, "mounted")
		}
	}
	if base != len(baseMounts) {
		return fail("mounts", fmt.Sprintf("%d base mounts", len(baseMounts)), strconv.Itoa(base))
	}
	return nil
}
