package selfcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The fixtures are real probe reports from this engine (Docker 20.10, cgroup
// v1, kernel 6.x), written by integration/hostile with -update: one from a
// sandbox, one from the deliberately weakened negative-control container.
func fixture(t *testing.T, name string) probe.Report {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func sandboxExpect() Expect {
	return Expect{
		CandidateUID: 65534, CandidateGID: 65534,
		Env:      map[string]string{"HOME": "/work", "HOSTNAME": "sandbox", "SANDBOXD_SELFCHECK": "1"},
		Hostname: "sandbox", Connect: true, Resolve: true,
		ReadOnly: []string{"/bundle", "/inputs/probe"},
	}
}

func failedNames(props []Property) []string {
	var out []string
	for _, p := range Failed(props) {
		out = append(out, p.Name)
	}
	return out
}

func TestSandboxReportHolds(t *testing.T) {
	props := Properties(fixture(t, "sandbox.json"), sandboxExpect())
	if got := failedNames(props); len(got) != 0 {
		for _, p := range Failed(props) {
			t.Errorf("%s: %s", p.Name, p.Detail)
		}
		t.Fatalf("got failed %v, want none", got)
	}
	if len(props) < 100 {
		t.Errorf("got %d properties, want every syscall, socket, mask and write judged", len(props))
	}
}

func TestWeakenedReportFails(t *testing.T) {
	exp := sandboxExpect()
	exp.Resolve = false // the control never resolves: its resolver is the host's
	exp.ReadOnly = []string{"/etc"}
	exp.Env = map[string]string{"HOME": "/work", "HOSTNAME": "sandbox"}
	got := failedNames(Properties(fixture(t, "weakened.json"), exp))
	for _, want := range []string{"candidate-user", "capabilities-eff", "no-new-privileges", "seccomp-filter",
		"syscall-unshare", "syscall-clone3", "syscall-open_tree", "root-read-only", "dev-shm", "resolv-conf", "cgroup-namespace",
		"foreign-abi"} {
		if !slices.Contains(got, want) {
			t.Errorf("weakened report: %s held, want it failed (failed: %v)", want, got)
		}
	}
}

// TestEachWeakeningIsNamed breaks one observation at a time in the sandbox
// report and checks that exactly the matching property fails.
func TestEachWeakeningIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*probe.Report)
		want   []string
	}{
		{"effective capability", func(r *probe.Report) { r.Status["CapEff"] = "0000000000200000" }, []string{"capabilities-eff"}},
		{"bounding beyond helper caps", func(r *probe.Report) { r.Status["CapBnd"] = "00000000002000c0" }, []string{"capabilities-bounding"}},
		{"ambient capability", func(r *probe.Report) { r.Status["CapAmb"] = "0000000000000001" }, []string{"capabilities-amb"}},
		{"no seccomp", func(r *probe.Report) { r.Status["Seccomp"] = "0" }, []string{"seccomp-filter"}},
		{"new privileges allowed", func(r *probe.Report) { r.Status["NoNewPrivs"] = "0" }, []string{"no-new-privileges"}},
		{"root uid", func(r *probe.Report) { r.UID = 0; r.Status["Uid"] = "0 0 0 0" }, []string{"candidate-user"}},
		{"unshare allowed", func(r *probe.Report) { setErrno(r.Syscalls, "unshare", "EINVAL") }, []string{"syscall-unshare"}},
		{"clone3 EPERM breaks libc fallback", func(r *probe.Report) { setErrno(r.Syscalls, "clone3", "EPERM") }, []string{"syscall-clone3"}},
		{"io_uring allowed", func(r *probe.Report) { setErrno(r.Syscalls, "io_uring_setup", "") }, []string{"syscall-io_uring_setup"}},
		{"syscall not observed", func(r *probe.Report) { r.Syscalls = r.Syscalls[1:] }, []string{"syscall-ptrace"}},
		{"vsock", func(r *probe.Report) { setErrno(r.Sockets, "AF_VSOCK", "") }, []string{"socket-AF_VSOCK"}},
		{"kcore readable", func(r *probe.Report) { r.Reads[2].Bytes = 4096; r.Reads[2].Errno = "" }, []string{"masked-/proc/kcore"}},
		{"helper environ readable", func(r *probe.Report) { r.Reads[len(r.Reads)-1].Errno = ""; r.Reads[len(r.Reads)-1].Bytes = 30 }, []string{"secret-" + lastRead(r0(t)).Path}},
		{"proc sys writable", func(r *probe.Report) { setErrno(r.Writes, "/proc/sys/kernel/hostname", "") }, []string{"write-/proc/sys/kernel/hostname"}},
		{"result channel writable", func(r *probe.Report) { setErrno(r.Writes, "/proc/1/fd/1", "") }, []string{"write-/proc/1/fd/1"}},
		{"bundle writable", func(r *probe.Report) { setErrno(r.Writes, "create /bundle", "") }, []string{"write-create /bundle"}},
		{"rootfs writable", func(r *probe.Report) { r.RootReadOnly = false }, []string{"root-read-only"}},
		{"dev shm writable", func(r *probe.Report) { r.DevShm.Errno = "" }, []string{"dev-shm"}},
		{"bridge interface", func(r *probe.Report) { r.Interfaces = []string{"eth0", "lo"} }, []string{"network-interfaces"}},
		{"host listener reached", func(r *probe.Report) { r.Connect.OK = true }, []string{"host-loopback"}},
		{"no connect attempt", func(r *probe.Report) { r.Connect = nil }, []string{"host-loopback"}},
		{"name resolved", func(r *probe.Report) { r.Resolve.OK = true }, []string{"name-resolution"}},
		{"host resolver", func(r *probe.Report) { r.ResolvConf = "nameserver 127.0.0.1\nsearch corp.example\n" }, []string{"resolv-conf"}},
		{"secret in env", func(r *probe.Report) { r.Env = append(r.Env, "AWS_SECRET_ACCESS_KEY=x") }, []string{"environment"}},
		{"host cgroup path", func(r *probe.Report) { r.Cgroup[0] = "4:memory:/docker/abc" }, []string{"cgroup-namespace"}},
		{"host bind mount", func(r *probe.Report) {
			r.Mountinfo = append(r.Mountinfo, "99 69 254:0 /home/user /work/src ro,relatime - ext4 /dev/vda rw")
		}, []string{"mounts"}},
		{"engine socket", func(r *probe.Report) {
			r.Mountinfo = append(r.Mountinfo, "99 69 0:20 /docker.sock /run/docker.sock rw,nosuid - tmpfs tmpfs rw")
		}, []string{"mounts"}},
		{"writable volume", func(r *probe.Report) {
			r.Mountinfo = append(r.Mountinfo, "99 69 254:0 /var/lib/docker/volumes/x/_data /inputs/x rw,relatime - ext4 /dev/vda rw")
		}, []string{"mounts"}},
		{"leaked descriptor (CVE-2024-21626)", func(r *probe.Report) { r.FDs["7"] = "/sys/fs/cgroup" }, []string{"file-descriptors"}},
		{"leaked cgroup v2 file", func(r *probe.Report) { r.FDs["7"] = "/sys/fs/cgroup/memory.max" }, []string{"file-descriptors"}},
		{"leaked nested cpu.max", func(r *probe.Report) { r.FDs["7"] = "/sys/fs/cgroup/x/cpu.max" }, []string{"file-descriptors"}},
		{"hostname", func(r *probe.Report) { r.Hostname = "build-host-17" }, []string{"hostname"}},
		{"i386 ABI allowed", func(r *probe.Report) { r.ForeignABI.Outcome = "allowed" }, []string{"foreign-abi"}},
		{"i386 ABI not watched", func(r *probe.Report) { r.ForeignABI.Outcome = "cannot watch the thread: x" }, []string{"foreign-abi"}},
		{"i386 ABI child failed", func(r *probe.Report) { r.ForeignABI.Outcome = "child failed: exit status 2: " }, []string{"foreign-abi"}},
		{"i386 ABI not observed", func(r *probe.Report) { r.ForeignABI = nil }, []string{"foreign-abi"}},
		{"i386 ABI probe panicked", func(r *probe.Report) { r.ForeignABI.Outcome = "panic: runtime error: index out of range" }, []string{"foreign-abi"}},
		{"i386 ABI: the process killed by another signal", func(r *probe.Report) { r.ForeignABI.Outcome = "signal SIGKILL" }, []string{"foreign-abi"}},
		{"i386 ABI: the process killed by seccomp", func(r *probe.Report) { r.ForeignABI.Outcome = "signal SIGSYS" }, nil},
		{"no ABI named, on a host that has one", func(r *probe.Report) { r.ForeignABI.ABI = "" }, []string{"foreign-abi"}},
		// A kernel without the i386 ABI faults the call: refused too.
		{"no i386 ABI in the kernel", func(r *probe.Report) {
			r.ForeignABI.Outcome = "fault: runtime error: invalid memory address or nil pointer dereference"
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fixture(t, "sandbox.json")
			tc.mutate(&r)
			got := failedNames(Properties(r, sandboxExpect()))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got failed %v, want %v", got, tc.want)
			}
		})
	}
}

// runscExpect is what selfcheck asks of a sandbox on runsc.
func runscExpect() Expect {
	exp := sandboxExpect()
	exp.Volumes = []string{"/.sandboxd", "/bundle", "/inputs/probe"}
	exp.Runtime = sandbox.RuntimeRunsc
	return exp
}

// sandbox-runsc.json is a real probe report from gVisor (the pinned runsc
// on containerd, cgroup v2 inside the sandbox): its /dev is gVisor's "dev"
// and its volumes are 9p mounts of gVisor's gofer, and it holds as runsc.
func TestRunscReportHolds(t *testing.T) {
	props := Properties(fixture(t, "sandbox-runsc.json"), runscExpect())
	for _, p := range Failed(props) {
		t.Errorf("%s: %s", p.Name, p.Detail)
	}
	if len(props) < 100 {
		t.Errorf("got %d properties, want every syscall, socket, mask and write judged", len(props))
	}
}

// gVisor's forms are accepted for runsc only: the same report judged as a
// runc sandbox's fails its mounts, whatever volumes were asked for.
func TestGVisorFormsFailUnderRunc(t *testing.T) {
	for _, rt := range []string{"", sandbox.RuntimeRunc} {
		exp := runscExpect()
		exp.Runtime = rt
		if got := failedNames(Properties(fixture(t, "sandbox-runsc.json"), exp)); !slices.Equal(got, []string{"mounts"}) {
			t.Errorf("runtime %q: got failed %v, want [mounts]", rt, got)
		}
	}
	r := fixture(t, "sandbox.json")
	r.Mountinfo = append(r.Mountinfo,
		"17 10 0:17 / /bundle ro,nosuid - 9p none ro,trans=fd,rfdno=7,wfdno=7,aname=/",
		"12 10 0:12 / /dev rw,nosuid - dev none rw,mode=0755")
	exp := sandboxExpect()
	exp.Volumes = runscExpect().Volumes
	if got := failedNames(Properties(r, exp)); !slices.Equal(got, []string{"mounts"}) {
		t.Errorf("runc report with 9p and dev mounts: got failed %v, want [mounts]", got)
	}
}

// Under runsc only the exact forms pass: 9p read-only over the gofer's
// descriptor at a volume the broker mounts, "dev" at /dev.
func TestRunscMountFormsAreNarrow(t *testing.T) {
	for _, tc := range []struct {
		name, line string
	}{
		{"9p elsewhere", "30 10 0:30 / /home ro,nosuid - 9p none ro,trans=fd,rfdno=9,wfdno=9,aname=/"},
		{"9p writable volume", "30 10 0:30 / /inputs/probe rw,nosuid - 9p none rw,trans=fd,rfdno=9,wfdno=9,aname=/"},
		{"9p read-only mount of a writable filesystem", "30 10 0:30 / /bundle ro,nosuid - 9p none rw,trans=fd,rfdno=9,wfdno=9,aname=/"},
		{"9p over a network", "30 10 0:30 / /bundle ro,nosuid - 9p 10.0.0.1 ro,trans=tcp,port=564"},
		{"9p of a host subtree", "30 10 0:30 /home/user /bundle ro,nosuid - 9p none ro,trans=fd,rfdno=9,wfdno=9,aname=/"},
		{"dev elsewhere", "30 10 0:30 / /work/dev rw,nosuid - dev none rw,mode=0755"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fixture(t, "sandbox-runsc.json")
			r.Mountinfo = append(r.Mountinfo, tc.line)
			if got := failedNames(Properties(r, runscExpect())); !slices.Equal(got, []string{"mounts"}) {
				t.Fatalf("got failed %v, want [mounts]", got)
			}
		})
	}
}

func r0(t *testing.T) probe.Report { return fixture(t, "sandbox.json") }

func lastRead(r probe.Report) probe.FileRead { return r.Reads[len(r.Reads)-1] }

func setErrno(list []probe.Attempt, name, errno string) {
	for i := range list {
		if list[i].Name == name {
			list[i].Errno = errno
			return
		}
	}
	panic("no attempt " + name)
}

func TestCacheKeepsOnlyPassesForTheSameKey(t *testing.T) {
	o := Options{StateDir: t.TempDir()}
	key := Key{EngineVersion: "20.10.24", ProfileDigest: "sha256:aa", Image: "sha256:bb", ProbeDigest: "sha256:cc"}
	pass := &Report{Schema: ReportSchema, Key: key, OK: true, Properties: []Property{{Name: "x", OK: true}}}
	if err := o.store(pass); err != nil {
		t.Fatal(err)
	}
	if r, ok := o.cached(key); !ok || !r.Cached {
		t.Fatalf("got cached %v, want the stored pass", ok)
	}
	for _, other := range []func(*Key){
		func(k *Key) { k.EngineVersion = "24.0.0" },
		func(k *Key) { k.ProfileDigest = "sha256:ab" },
		func(k *Key) { k.Image = "sha256:bc" },
		func(k *Key) { k.ProbeDigest = "sha256:cd" },
		func(k *Key) { k.KernelVersion = "6.19" },
		func(k *Key) { k.Components = "runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u2)" },
		func(k *Key) { k.BootID = "another boot" },
	} {
		k := key
		other(&k)
		if _, ok := o.cached(k); ok {
			t.Errorf("key %+v answered from the cache of %+v", k, key)
		}
	}
	// A cache file claiming a pass with a failed property is not a pass.
	bad := *pass
	bad.Properties = []Property{{Name: "seccomp-filter", OK: false}}
	b, _ := json.Marshal(bad)
	if err := os.WriteFile(o.cachePath(key), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := o.cached(key); ok {
		t.Error("a cached report with a failed property was accepted")
	}
}

func TestErrNamesFailedProperties(t *testing.T) {
	r := &Report{OK: false, Properties: []Property{{Name: "seccomp-filter"}, {Name: "dev-shm", OK: true}, {Name: "syscall-bpf"}}}
	err := r.Err()
	if err == nil || !strings.Contains(err.Error(), "seccomp-filter, syscall-bpf") {
		t.Fatalf("got %v, want ErrFailed naming seccomp-filter, syscall-bpf", err)
	}
	if (&Report{OK: true}).Err() != nil {
		t.Error("a passing report returned an error")
	}
}
