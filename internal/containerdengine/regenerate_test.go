package containerdengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/broker"
)

// createdEngine is the test engine with a state directory of its own.
func createdEngine(t *testing.T) *Engine {
	t.Helper()
	e := testEngine()
	e.cfg.StateDir = t.TempDir()
	if err := os.Mkdir(e.ioDir(""), 0o700); err != nil {
		t.Fatal(err)
	}
	return e
}

// created is what ContainerCreate leaves for o: containerd's record, and
// the create options the engine keeps in the container's directory.
func created(t *testing.T, e *Engine, o client.ContainerCreateOptions) containers.Container {
	t.Helper()
	info := recordFor(t, e, o)
	if err := os.Mkdir(e.ioDir(info.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.keepInputs(info.ID, createInputs{Config: o.Config, HostConfig: o.HostConfig, ImageEnv: []string{"PATH=/bin"}}); err != nil {
		t.Fatal(err)
	}
	return info
}

// withSpec is info with its spec changed, as someone who can write
// containerd's record would change it.
func withSpec(t *testing.T, info containers.Container, change func(*specs.Spec)) containers.Container {
	t.Helper()
	s, err := specOf(info)
	if err != nil {
		t.Fatal(err)
	}
	change(s)
	if info.Spec, err = typeurl.MarshalAny(s); err != nil {
		t.Fatal(err)
	}
	return info
}

// withJSON is info with the JSON of its spec rewritten.
func withJSON(info containers.Container, change func([]byte) []byte) containers.Container {
	info.Spec = rawAny{info.Spec.GetTypeUrl(), change(slices.Clone(info.Spec.GetValue()))}
	return info
}

// The broker's sandboxes, as it asks for them, get their task: the record
// ContainerCreate writes passes the rows and is the spec made again from
// the options it keeps, through their JSON on disk.
func TestCreatedSandboxPassesTheRecordCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*client.ContainerCreateOptions)
	}{
		{"the sandbox on runc", func(*client.ContainerCreateOptions) {}},
		{"the sandbox on runsc", func(o *client.ContainerCreateOptions) {
			o.HostConfig.Runtime = "runsc"
			o.HostConfig.PidsLimit = i64(4*64 + 256) // the broker's pids cgroup on runsc
		}},
		{"the sandbox, runtime unnamed", func(o *client.ContainerCreateOptions) { o.HostConfig.Runtime = "" }},
		{"other limits", func(o *client.ContainerCreateOptions) {
			r := &o.HostConfig.Resources
			r.Memory, r.MemorySwap, r.NanoCPUs, r.PidsLimit = 1<<30, 1<<30, 250_000_000, i64(7)
			r.Ulimits[1] = &container.Ulimit{Name: "fsize", Soft: 1 << 30, Hard: 1 << 30}
			o.HostConfig.Tmpfs["/work"] = "rw,exec,nosuid,nodev,size=1073741824,mode=0755,uid=1000,gid=1000"
		}},
		{"read-only inputs", func(o *client.ContainerCreateOptions) {
			for _, v := range []string{"b-input-3", "b-input-4"} {
				o.HostConfig.Mounts = append(o.HostConfig.Mounts, mount.Mount{Type: mount.TypeVolume, Source: v, Target: "/inputs/" + v,
					ReadOnly: true, VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
			}
		}},
		{"a pooled sandbox, no inputs", func(o *client.ContainerCreateOptions) {
			o.Name = "b-pool-0123456789abcdef"
			o.HostConfig.Mounts = o.HostConfig.Mounts[:1]
			o.Config.Labels = map[string]string{broker.LabelRole: "pool", broker.LabelPool: "0011223344556677", broker.LabelPoolKey: "k"}
		}},
		{"one capability, stdin closed, no resolver", func(o *client.ContainerCreateOptions) {
			o.HostConfig.CapAdd = []string{"SETUID"}
			o.HostConfig.DNS = nil
			o.Config.OpenStdin, o.Config.StdinOnce, o.Config.AttachStdin = false, false, false
		}},
		{"an environment with HOSTNAME and characters JSON escapes", func(o *client.ContainerCreateOptions) {
			o.Config.Env = append(o.Config.Env, "HOSTNAME=mine", "X=<a&b>", "Y=é\u2028")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := createdEngine(t)
			o := sandboxOptions()
			tc.change(&o)
			info := created(t, e, o)
			if _, _, err := e.checkRecord(info); err != nil {
				t.Fatalf("got %v, want the record passing", err)
			}
			// A rename changes the record's labels, never its ID.
			info.Labels[labelName] = "b-job-renamed"
			if _, _, err := e.checkRecord(info); err != nil {
				t.Fatalf("after a rename: got %v, want the record passing", err)
			}
		})
	}
}

// A spec that passes every row can still hold what the rows do not read:
// before its task it is compared, field for field, with the spec made
// again from the kept create options, and refused naming the first path
// where it differs. rowsPass records which of these the rows alone let
// through (the check before this one).
func TestRecordOutsideTheRowsIsRefused(t *testing.T) {
	// The sandbox's mounts: 6 base mounts, tmpfs /tmp and /work, then the
	// helper's and one input's volume.
	const tmp, volume = 6, 9
	for _, tc := range []struct {
		name     string
		change   func(*testing.T, containers.Container) containers.Container
		setting  string // the SettingError's
		rowsPass bool
	}{
		{"annotations", specChange(func(s *specs.Spec) { s.Annotations = map[string]string{"run.oci.keep_original_groups": "1"} }),
			"oci.annotations", true},
		{"unified cgroup files", specChange(func(s *specs.Spec) { s.Linux.Resources.Unified = map[string]string{"memory.max": "max"} }),
			"oci.linux.resources.unified", true},
		{"OOM killer disabled", specChange(func(s *specs.Spec) { s.Linux.Resources.Memory.DisableOOMKiller = ptr(true) }),
			"oci.linux.resources.memory.disableOOMKiller", true},
		{"OOM score lowered", specChange(func(s *specs.Spec) { s.Process.OOMScoreAdj = ptr(-1000) }),
			"oci.process.oomScoreAdj", true},
		{"personality", specChange(func(s *specs.Spec) { s.Linux.Personality = &specs.LinuxPersonality{Domain: specs.PerLinux32} }),
			"oci.linux.personality", true},
		{"an rlimit more", specChange(func(s *specs.Spec) {
			s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_MEMLOCK", Soft: ^uint64(0), Hard: ^uint64(0)})
		}), "oci.process.rlimits[4]", true},
		{"an rlimit raised", specChange(func(s *specs.Spec) { s.Process.Rlimits[3].Hard = ^uint64(0) }),
			"oci.process.rlimits[3].hard", true},
		{"a sysctl", specChange(func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.shm_rmid_forced": "0"} }),
			"oci.linux.sysctl", false},
		{"a read-only volume made writable by a later option", specChange(func(s *specs.Spec) {
			s.Mounts[volume].Options = append(s.Mounts[volume].Options, "rw")
		}), "oci.mounts[9].options[4]", true},
		{"suid on a tmpfs by a later option", specChange(func(s *specs.Spec) { s.Mounts[tmp].Options = append(s.Mounts[tmp].Options, "suid") }),
			"oci.mounts[6].options[6]", true},
		{"Intel RDT", specChange(func(s *specs.Spec) { s.Linux.IntelRdt = &specs.LinuxIntelRdt{ClosID: "sandbox"} }),
			"oci.linux.intelRdt", true},
		{"seccomp flags", specChange(func(s *specs.Spec) {
			s.Linux.Seccomp.Flags = append(s.Linux.Seccomp.Flags, specs.LinuxSeccompFlagLog)
		}), "oci.linux.seccomp.flags", false},
		{"another cgroup", specChange(func(s *specs.Spec) { s.Linux.CgroupsPath = "/" }),
			"oci.linux.cgroupsPath", true},
		{"shared root propagation", specChange(func(s *specs.Spec) { s.Linux.RootfsPropagation = "shared" }),
			"oci.linux.rootfsPropagation", true},
		{"a domain name", specChange(func(s *specs.Spec) { s.Domainname = "example.com" }),
			"oci.domainname", true},
		{"a prestart hook", specChange(func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh"}}} }),
			"oci.hooks", false},
		{"an empty hooks object", specChange(func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: []specs.Hook{}} }),
			"oci.hooks", true},
		{"a supplementary group", specChange(func(s *specs.Spec) { s.Process.User.AdditionalGids = []uint32{0} }),
			"oci.process.user.additionalGids", true},
		{"a mount label", specChange(func(s *specs.Spec) { s.Linux.MountLabel = "system_u:object_r:container_file_t:s0" }),
			"oci.linux.mountLabel", true},
		{"the process's arguments", specChange(func(s *specs.Spec) { s.Process.Args = []string{"/bin/sh", "-c", "id"} }),
			"oci.process.args[0]", true},
		{"a field this spec version does not name", jsonChange(func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"linux":{`), []byte(`"linux":{"netDevices":{"eth0":{}},`), 1)
		}), "oci.linux.netDevices", true},
		{"a key written twice (Go merges the two)", jsonChange(func(b []byte) []byte {
			return append([]byte(`{"linux":{"rootfsPropagation":"shared"},`), b[1:]...)
		}), "oci", true},
		{"a key in other case (Go reads it as the same)", jsonChange(func(b []byte) []byte {
			return append(b[:len(b)-1], []byte(`,"LINUX":{"rootfsPropagation":"shared"}}`)...)
		}), "oci.LINUX", true},
		{"data after the spec (runc's decoder reads the first value)", jsonChange(func(b []byte) []byte {
			return append(b, []byte(`{"linux":{}}`)...)
		}), "oci", false},
		{"runc for a runsc sandbox", func(t *testing.T, info containers.Container) containers.Container {
			a, err := typeurl.MarshalAny(&options.Options{})
			if err != nil {
				t.Fatal(err)
			}
			info.Runtime.Options = a
			return info
		}, "runtime", true},
		{"another root view", func(_ *testing.T, info containers.Container) containers.Container {
			info.SnapshotKey = "sandboxd-rootfs-other"
			return info
		}, "rootfs", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := createdEngine(t)
			o := sandboxOptions()
			o.HostConfig.Runtime = "runsc"
			info := tc.change(t, created(t, e, o))
			s, err := specOf(info)
			if err == nil {
				err = checkSandboxSpec(e, s)
			}
			if rowsPass := err == nil; rowsPass != tc.rowsPass {
				t.Errorf("the rows alone: got %v, want passing %v", err, tc.rowsPass)
			}
			_, _, err = e.checkRecord(info)
			var se *broker.SettingError
			if tc.rowsPass && (!errors.As(err, &se) || se.Setting != tc.setting) {
				t.Fatalf("got %v, want refused naming %s", err, tc.setting)
			}
			if err == nil {
				t.Fatal("got a task, want the record refused")
			}
			t.Log(err)
			// The comparison alone refuses it too, whatever the rows say.
			in, kerr := e.keptInputs(info.ID)
			if kerr != nil {
				t.Fatal(kerr)
			}
			if err := e.checkMadeFrom(info, in); !errors.As(err, &se) || se.Setting != tc.setting {
				t.Errorf("the comparison: got %v, want refused naming %s", err, tc.setting)
			}
		})
	}
}

func specChange(change func(*specs.Spec)) func(*testing.T, containers.Container) containers.Container {
	return func(t *testing.T, info containers.Container) containers.Container { return withSpec(t, info, change) }
}

func jsonChange(change func([]byte) []byte) func(*testing.T, containers.Container) containers.Container {
	return func(_ *testing.T, info containers.Container) containers.Container { return withJSON(info, change) }
}

func ptr[T any](v T) *T { return &v }

// Go's decoder merges a key written twice: the rows read the merged spec,
// as runc does, and see nothing wrong with it. (Why sameJSON refuses one.)
func TestSpecOfMergesAKeyWrittenTwice(t *testing.T) {
	e := createdEngine(t)
	info := withJSON(created(t, e, sandboxOptions()), func(b []byte) []byte {
		return append([]byte(`{"linux":{"rootfsPropagation":"shared"},`), b[1:]...)
	})
	s, err := specOf(info)
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.RootfsPropagation != "shared" || len(s.Linux.Namespaces) == 0 {
		t.Fatalf("got propagation %q with %d namespaces, want the two linux objects merged", s.Linux.RootfsPropagation, len(s.Linux.Namespaces))
	}
}

// A container without kept create options, or with options that do not
// decode, never gets a task.
func TestRecordWithoutItsOptionsIsRefused(t *testing.T) {
	e := createdEngine(t)
	info := created(t, e, sandboxOptions())
	if err := os.WriteFile(e.ioDir(info.ID)+"/"+createFile, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.checkRecord(info); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("options that do not decode: got %v, want a failed precondition", err)
	}
	if err := os.Remove(e.ioDir(info.ID) + "/" + createFile); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.checkRecord(info); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("no options: got %v, want a failed precondition", err)
	}
}

// What the record says of itself outside its spec (its labels: image,
// runtime, resolver, log) is not what its spec is compared with: a
// record whose spec and labels agree on weaker settings is refused.
func TestRecordLabelsDoNotChangeTheComparison(t *testing.T) {
	e := createdEngine(t)
	info := withSpec(t, created(t, e, sandboxOptions()), func(s *specs.Spec) { s.Process.OOMScoreAdj = ptr(-1000) })
	info.Labels[labelImage] = "sha256:" + strings.Repeat("b", 64)
	info.Labels[labelRuntime] = "runc"
	delete(info.Labels, labelDNS)
	info.Labels[labelLog] = `{"Type":"none"}`
	var se *broker.SettingError
	if _, _, err := e.checkRecord(info); !errors.As(err, &se) || se.Setting != "oci.process.oomScoreAdj" {
		t.Errorf("got %v, want refused naming oci.process.oomScoreAdj", err)
	}
}

// An update writes the spec made from the kept options with the new
// memory limits, and keeps those options: the record passes the check
// after it, and reports the new limits. A limit outside the rows is
// refused before anything is written.
func TestUpdateKeepsTheRecordMadeAgain(t *testing.T) {
	e := createdEngine(t)
	o := sandboxOptions()
	info := created(t, e, o)
	_, in, err := e.checkRecord(info)
	if err != nil {
		t.Fatal(err)
	}
	mem := 2 * o.HostConfig.Memory
	next, s, err := e.updated(in, info.ID, &container.Resources{Memory: mem, MemorySwap: mem})
	if err != nil {
		t.Fatal(err)
	}
	if info.Spec, err = typeurl.MarshalAny(s); err != nil {
		t.Fatal(err)
	}
	if err := e.keepInputs(info.ID, next); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.checkRecord(info); err != nil {
		t.Fatalf("after the update: got %v, want the record passing", err)
	}
	again, err := e.regenerate(next, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, s) {
		t.Errorf("the spec made again after the update differs from the one written")
	}
	got := e.inspectOf(s, info.Labels, "runc").HostConfig
	if got.Memory != mem || got.MemorySwap != mem {
		t.Errorf("after the update: memory %d swap %d, want %d both", got.Memory, got.MemorySwap, mem)
	}
	if in.HostConfig.Memory != o.HostConfig.Memory {
		t.Errorf("the update changed the options it was given: memory %d, want %d", in.HostConfig.Memory, o.HostConfig.Memory)
	}

	for _, swap := range []int64{4 * mem, 0, -1} {
		_, _, err := e.updated(next, info.ID, &container.Resources{Memory: mem, MemorySwap: swap})
		var se *broker.SettingError
		if !errors.As(err, &se) || se.Setting != "oci.resources.memory.swap" {
			t.Errorf("swap %d: got %v, want refused naming oci.resources.memory.swap", swap, err)
		}
	}
}

// The comparison reads JSON as a Go runtime does: a null is absent, an
// empty object or list is not; numbers compare as written; a key written
// twice or anything after the value is refused; the path names the first
// difference in key order, quoting keys that are not plain names.
func TestSameJSON(t *testing.T) {
	for _, tc := range []struct {
		name, want, got string
		setting         string // "" for the same
		gotText         string // the SettingError's Got, when set
	}{
		{"equal", `{"a":{"b":[1,"x",true]}}`, `{"a":{"b":[1,"x",true]}}`, "", ""},
		{"key order", `{"a":1,"b":2}`, `{"b":2,"a":1}`, "", ""},
		{"null is absent", `{"a":1}`, `{"a":1,"b":null}`, "", ""},
		{"absent is null", `{"a":1,"b":null}`, `{"a":1}`, "", ""},
		{"an empty object is not absent", `{"a":1}`, `{"a":1,"b":{}}`, "oci.b", "{}"},
		{"absent is not an empty object", `{"a":1,"b":{}}`, `{"a":1}`, "oci.b", "absent"},
		{"an empty list is not absent", `{"a":1}`, `{"a":1,"b":[]}`, "oci.b", "[]"},
		{"a number as written", `{"a":1000}`, `{"a":1e3}`, "oci.a", "1e3"},
		{"a string for a number", `{"a":1}`, `{"a":"1"}`, "oci.a", `"1"`},
		{"an element more", `{"a":[1]}`, `{"a":[1,2]}`, "oci.a[1]", "2"},
		{"an element less", `{"a":[1,2]}`, `{"a":[1]}`, "oci.a[1]", "absent"},
		{"first in key order", `{"a":{"x":1,"y":1}}`, `{"a":{"x":2,"y":2}}`, "oci.a.x", "2"},
		{"a key that is not a name", `{"a":{}}`, `{"a":{"memory.max":"max"}}`, `oci.a["memory.max"]`, `"max"`},
		{"a key written twice", `{"a":1}`, `{"a":1,"a":1}`, "oci", ""},
		{"a nested key written twice", `{"a":{"b":1}}`, `{"a":{"b":1,"b":2}}`, "oci", ""},
		{"data after the value", `{"a":1}`, `{"a":1} {}`, "oci", ""},
		{"not JSON", `{"a":1}`, `{"a":`, "oci", ""},
		{"not an object", `{"a":1}`, `[]`, "oci", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sameJSON([]byte(tc.want), []byte(tc.got))
			var se *broker.SettingError
			switch {
			case tc.setting == "" && err != nil:
				t.Errorf("got %v, want the same", err)
			case tc.setting != "" && (!errors.As(err, &se) || se.Setting != tc.setting):
				t.Errorf("got %v, want a SettingError naming %s", err, tc.setting)
			case tc.gotText != "" && se.Got != tc.gotText:
				t.Errorf("got %q as the value found, want %q", se.Got, tc.gotText)
			}
		})
	}
	long := `{"a":"` + strings.Repeat("x", 1000) + `"}`
	err := sameJSON([]byte(`{}`), []byte(long))
	var se *broker.SettingError
	if !errors.As(err, &se) || len(se.Got) > 200 || !strings.Contains(se.Got, "1002 bytes") {
		t.Errorf("a long value: got %v, want it cut short, naming its length", err)
	}
}

// The options kept on disk make the same spec as the options given, for
// every shape the create tests use (JSON keeps what specFor reads).
func TestKeptInputsMakeTheSameSpec(t *testing.T) {
	e := createdEngine(t)
	for _, o := range []client.ContainerCreateOptions{sandboxOptions(), populateOptions()} {
		if o.Name == "" {
			o.Name = "sandboxd-populate-0123456789ab"
		}
		img := imageInfo{id: o.Config.Image, env: []string{"PATH=/bin", "A=b"}}
		want, err := e.specFor(o, img, o.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(e.ioDir(o.Name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := e.keepInputs(o.Name, createInputs{Config: o.Config, HostConfig: o.HostConfig, ImageEnv: img.env}); err != nil {
			t.Fatal(err)
		}
		in, err := e.keptInputs(o.Name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.regenerate(in, o.Name)
		if err != nil {
			t.Fatal(err)
		}
		wb, _ := json.Marshal(want)
		gb, _ := json.Marshal(got)
		if err := sameJSON(wb, gb); err != nil {
			t.Errorf("%s: %v", o.Name, err)
		}
	}
}

// populateOptions are the options of the never-started populate container
// (TestPopulateContainerNeverStarts).
func populateOptions() client.ContainerCreateOptions {
	return client.ContainerCreateOptions{
		Config: &container.Config{Image: "sha256:" + strings.Repeat("a", 64), Entrypoint: []string{"/nonexistent"}},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: "b-input-2", Target: "/v", VolumeOptions: &mount.VolumeOptions{NoCopy: true}}},
		},
	}
}
