package containerdengine

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
)

func testEngine() *Engine {
	return &Engine{
		cfg:      Config{Namespace: "sandboxd", StateDir: "/var/lib/sandboxd/containerd", Snapshotter: "overlayfs"},
		runtimes: map[string]string{"runc": "runc", "runsc": "/usr/lib/sandboxd/sandboxd-runsc"},
	}
}

// sandboxOptions are create options of the shape the broker asks for (its
// containerSpec): the sandbox every job gets.
func sandboxOptions() client.ContainerCreateOptions {
	pids := int64(64)
	init := true
	return client.ContainerCreateOptions{
		Name: "b-job-0123456789ab",
		Config: &container.Config{
			Hostname: "sandbox", User: "0:0", OpenStdin: true, StdinOnce: true,
			AttachStdin: true, AttachStdout: true, AttachStderr: true,
			Env: []string{"SANDBOXD_SHIM_NONCE=abc"}, Entrypoint: []string{helperPath}, Cmd: []string{},
			Image: "sha256:" + strings.Repeat("a", 64), WorkingDir: "/", Labels: map[string]string{broker.LabelRole: "job"},
		},
		HostConfig: &container.HostConfig{
			LogConfig:     container.LogConfig{Type: "local", Config: map[string]string{"max-size": "16m", "max-file": "1", "compress": "false"}},
			NetworkMode:   "none",
			RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
			CapDrop:       []string{"ALL"}, CapAdd: []string{"CAP_SETGID", "CAP_SETUID"},
			CgroupnsMode: container.CgroupnsModePrivate, DNS: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
			IpcMode: container.IPCModeNone, OomScoreAdj: 1000, ReadonlyRootfs: true,
			SecurityOpt: []string{"no-new-privileges:true", "seccomp=" + string(seccomp.JSON())},
			Tmpfs: map[string]string{
				"/work": "rw,exec,nosuid,nodev,size=33554432,mode=0755,uid=65534,gid=65534",
				"/tmp":  "rw,exec,nosuid,nodev,size=33554432,mode=1777",
			},
			Runtime: "runc",
			Resources: container.Resources{
				Memory: 128 << 20, MemorySwap: 128 << 20, NanoCPUs: 1_000_000_000, PidsLimit: &pids,
				Ulimits: []*container.Ulimit{{Name: "core"}, {Name: "fsize", Soft: 1 << 20, Hard: 1 << 20}, {Name: "nofile", Soft: 256, Hard: 256}, {Name: "nproc", Soft: 8192, Hard: 8192}},
			},
			Mounts: []mount.Mount{
				{Type: mount.TypeVolume, Source: "b-shim-1", Target: "/.sandboxd", ReadOnly: true, VolumeOptions: &mount.VolumeOptions{NoCopy: true}},
				{Type: mount.TypeVolume, Source: "b-input-2", Target: "/bundle", ReadOnly: true, VolumeOptions: &mount.VolumeOptions{NoCopy: true}},
			},
			Init: &init,
		},
	}
}

func sandboxSpec(t *testing.T) *specs.Spec {
	t.Helper()
	s, err := testEngine().specFor(sandboxOptions(), imageInfo{id: "sha256:" + strings.Repeat("a", 64), env: []string{"PATH=/bin"}}, "b-job-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The spec made for the broker's sandbox passes the security table, and
// read back as Docker's inspect it reports every security setting as asked.
func TestSandboxSpecReadsBackAsAsked(t *testing.T) {
	e := testEngine()
	s := sandboxSpec(t)
	if err := checkSandboxSpec(e, s); err != nil {
		t.Fatalf("the sandbox's own spec fails the check: %v", err)
	}
	opts := sandboxOptions()
	labels := map[string]string{labelImage: opts.Config.Image, labelDNS: "127.0.0.1", labelStdin: "open", labelLog: `{"Type":"local","Config":{"compress":"false","max-file":"1","max-size":"16m"}}`}
	got := e.inspectOf(s, labels, "runc")
	w, hc := opts.HostConfig, got.HostConfig
	for _, c := range []struct {
		name      string
		want, got any
	}{
		{"Privileged", false, hc.Privileged},
		{"CapDrop", []string{"ALL"}, hc.CapDrop},
		{"CapAdd", w.CapAdd, hc.CapAdd},
		{"SecurityOpt", w.SecurityOpt, hc.SecurityOpt},
		{"ReadonlyRootfs", true, hc.ReadonlyRootfs},
		{"NetworkMode", container.NetworkMode("none"), hc.NetworkMode},
		{"Dns", w.DNS, hc.DNS},
		{"IpcMode", container.IPCModeNone, hc.IpcMode},
		{"CgroupnsMode", container.CgroupnsModePrivate, hc.CgroupnsMode},
		{"PidMode", container.PidMode(""), hc.PidMode},
		{"UTSMode", container.UTSMode(""), hc.UTSMode},
		{"UsernsMode", container.UsernsMode(""), hc.UsernsMode},
		{"Memory", w.Memory, hc.Memory},
		{"MemorySwap", w.MemorySwap, hc.MemorySwap},
		{"NanoCPUs", w.NanoCPUs, hc.NanoCPUs},
		{"PidsLimit", *w.PidsLimit, *hc.PidsLimit},
		{"OomScoreAdj", w.OomScoreAdj, hc.OomScoreAdj},
		{"Ulimits", fmt.Sprint(w.Ulimits), fmt.Sprint(hc.Ulimits)},
		{"Tmpfs", w.Tmpfs, hc.Tmpfs},
		{"Mounts", w.Mounts, hc.Mounts},
		{"Devices", 0, len(hc.Devices) + len(hc.DeviceCgroupRules)},
		{"Binds", 0, len(hc.Binds)},
		{"Init", true, *hc.Init},
		{"LogConfig", w.LogConfig, hc.LogConfig},
		{"Runtime", "runc", hc.Runtime},
		{"User", "0:0", got.Config.User},
		{"Entrypoint", []string{helperPath}, []string(got.Config.Entrypoint)},
		{"Image", opts.Config.Image, got.Image},
		{"MaskedPaths", maskedPaths, hc.MaskedPaths},
		{"ReadonlyPaths", readonlyPaths, hc.ReadonlyPaths},
	} {
		if !reflect.DeepEqual(c.want, c.got) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

// Every row of the security table is checked on the read-back spec: a
// spec weakened in any one of them is refused, naming the row.
func TestWeakenedSpecIsRefused(t *testing.T) {
	e := testEngine()
	for _, tc := range []struct {
		row    string
		weaken func(*specs.Spec)
	}{
		{"namespaces", func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[1:] }},
		{"namespaces", func(s *specs.Spec) { s.Linux.Namespaces[4].Path = "/proc/1/ns/net" }},
		{"namespaces", func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		}},
		{"hooks", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh"}}} }},
		{"hooks", func(s *specs.Spec) { s.Hooks = &specs.Hooks{Poststart: []specs.Hook{{Path: "/bin/sh"}}} }},
		{"noNewPrivileges", func(s *specs.Spec) { s.Process.NoNewPrivileges = false }},
		{"terminal", func(s *specs.Spec) { s.Process.Terminal = true }},
		{"capabilities", func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		}},
		{"capabilities", func(s *specs.Spec) { s.Process.Capabilities.Ambient = []string{"CAP_SETUID"} }},
		{"capabilities", func(s *specs.Spec) { s.Process.Capabilities.Inheritable = []string{"CAP_SETUID"} }},
		{"root.readonly", func(s *specs.Spec) { s.Root.Readonly = false }},
		{"seccomp", func(s *specs.Spec) { s.Linux.Seccomp = nil }},
		{"seccomp", func(s *specs.Spec) { s.Linux.Seccomp.Syscalls = s.Linux.Seccomp.Syscalls[1:] }},
		{"maskedPaths", func(s *specs.Spec) { s.Linux.MaskedPaths = s.Linux.MaskedPaths[1:] }},
		{"readonlyPaths", func(s *specs.Spec) { s.Linux.ReadonlyPaths = nil }},
		{"resources.memory.limit", func(s *specs.Spec) { s.Linux.Resources.Memory = nil }},
		{"resources.memory.swap", func(s *specs.Spec) { *s.Linux.Resources.Memory.Swap = -1 }},
		{"resources.cpu.quota", func(s *specs.Spec) { s.Linux.Resources.CPU = nil }},
		{"resources.pids.limit", func(s *specs.Spec) { s.Linux.Resources.Pids = nil }},
		{"resources.devices", func(s *specs.Spec) {
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"})
		}},
		{"devices", func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/kmsg", Type: "c", Major: 1, Minor: 11}}
		}},
		{"sysctl", func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"net.ipv4.ip_forward": "1"} }},
		{"rlimits", func(s *specs.Spec) { s.Process.Rlimits = s.Process.Rlimits[1:] }},
		{"mounts", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind", "ro", "nosuid"}})
		}},
		{"mounts", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/sandboxd/containerd/volumes/x/_data", Options: []string{"rbind", "ro", "nosuid"}})
		}},
		{"mounts", func(s *specs.Spec) { s.Mounts[len(s.Mounts)-1].Options = []string{"rbind", "rw", "nosuid"} }},
		{"mounts", func(s *specs.Spec) {
			s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/proc" })
		}},
		{"mounts", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "size=1k"}})
		}},
		{"mounts", func(s *specs.Spec) { s.Mounts[len(s.Mounts)-3].Options = []string{"rw", "nosuid", "nodev"} }}, // a tmpfs without size
	} {
		t.Run(tc.row, func(t *testing.T) {
			s := sandboxSpec(t)
			tc.weaken(s)
			err := checkSandboxSpec(e, s)
			var se *broker.SettingError
			if !errors.As(err, &se) || se.Setting != "oci."+tc.row {
				t.Fatalf("got %v, want a SettingError naming oci.%s", err, tc.row)
			}
		})
	}
}

// A spec passes the hooks row only without a hook: Hooks nil, or every
// list of it empty. One hook in any of its lists (each field of
// specs.Hooks, so a list a later runtime-spec adds is covered too) is
// refused naming oci.hooks, since a hook runs on the host as root; so is
// the loopback hook an older sandboxd put in its specs, which fails
// closed. Inspect reports network none for the new network namespace
// whatever the hooks: the row, not inspect, refuses them.
func TestSpecWithAnyHookIsRefused(t *testing.T) {
	e := testEngine()
	refused := func(t *testing.T, h *specs.Hooks) {
		t.Helper()
		s := sandboxSpec(t)
		s.Hooks = h
		var se *broker.SettingError
		if err := checkSandboxSpec(e, s); !errors.As(err, &se) || se.Setting != "oci.hooks" {
			t.Errorf("hooks %+v: got %v, want a SettingError naming oci.hooks", *h, err)
		}
		if got := e.inspectOf(s, nil, "runc").HostConfig.NetworkMode; got != "none" {
			t.Errorf("hooks %+v: inspect reports network %q, want none", *h, got)
		}
	}
	kinds := reflect.TypeOf(specs.Hooks{})
	if kinds.NumField() < 6 {
		t.Fatalf("specs.Hooks has %d fields, want at least the 6 hook lists", kinds.NumField())
	}
	empty := &specs.Hooks{}
	for i := range kinds.NumField() {
		f := kinds.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			h := &specs.Hooks{}
			reflect.ValueOf(h).Elem().Field(i).Set(reflect.ValueOf([]specs.Hook{{Path: "/bin/true", Args: []string{"true"}}}))
			refused(t, h)
		})
		reflect.ValueOf(empty).Elem().Field(i).Set(reflect.ValueOf([]specs.Hook{}))
	}
	t.Run("an older sandboxd's loopback hook", func(t *testing.T) {
		refused(t, &specs.Hooks{Prestart: []specs.Hook{{Path: "/usr/lib/sandboxd/sandboxd-hook", Args: []string{"sandboxd-hook", "loopback-up"}}}})
	})
	for name, h := range map[string]*specs.Hooks{"no hooks": nil, "every list empty": empty} {
		t.Run(name, func(t *testing.T) {
			s := sandboxSpec(t)
			s.Hooks = h
			if err := checkSandboxSpec(e, s); err != nil {
				t.Errorf("got %v, want the spec passing", err)
			}
		})
	}
}

// What this engine cannot express is refused by name, never applied weaker.
func TestUnsupportedSettingsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		setting string
		change  func(*client.ContainerCreateOptions)
	}{
		{"Privileged", func(o *client.ContainerCreateOptions) { o.HostConfig.Privileged = true }},
		{"NetworkMode", func(o *client.ContainerCreateOptions) { o.HostConfig.NetworkMode = "bridge" }},
		{"PidMode", func(o *client.ContainerCreateOptions) { o.HostConfig.PidMode = "host" }},
		{"IpcMode", func(o *client.ContainerCreateOptions) { o.HostConfig.IpcMode = "host" }},
		{"CgroupnsMode", func(o *client.ContainerCreateOptions) { o.HostConfig.CgroupnsMode = "host" }},
		{"Binds", func(o *client.ContainerCreateOptions) { o.HostConfig.Binds = []string{"/:/host"} }},
		{"Mounts", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/", Target: "/host"})
		}},
		{"Mounts", func(o *client.ContainerCreateOptions) { o.HostConfig.Tmpfs["/proc/x"] = "size=1" }},
		{"Dns", func(o *client.ContainerCreateOptions) {
			o.HostConfig.DNS = []netip.Addr{netip.MustParseAddr("8.8.8.8")}
		}},
		{"Devices", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Devices = []container.DeviceMapping{{PathOnHost: "/dev/kvm", PathInContainer: "/dev/kvm"}}
		}},
		{"CapDrop", func(o *client.ContainerCreateOptions) { o.HostConfig.CapDrop = nil }},
		{"SecurityOpt", func(o *client.ContainerCreateOptions) {
			o.HostConfig.SecurityOpt = append(o.HostConfig.SecurityOpt, "apparmor=unconfined")
		}},
		{"Runtime", func(o *client.ContainerCreateOptions) { o.HostConfig.Runtime = "kata" }},
		{"LogConfig", func(o *client.ContainerCreateOptions) { o.HostConfig.LogConfig.Type = "syslog" }},
		{"Tty", func(o *client.ContainerCreateOptions) { o.Config.Tty = true }},
		{"User", func(o *client.ContainerCreateOptions) { o.Config.User = "root" }},
		{"Ulimits", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Ulimits = append(o.HostConfig.Ulimits, &container.Ulimit{Name: "bogus"})
		}},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			o := sandboxOptions()
			tc.change(&o)
			_, err := testEngine().specFor(o, imageInfo{}, "x")
			var ue *UnsupportedError
			if !errors.As(err, &ue) || ue.Setting != tc.setting {
				t.Fatalf("got %v, want an UnsupportedError naming %s", err, tc.setting)
			}
		})
	}
}
