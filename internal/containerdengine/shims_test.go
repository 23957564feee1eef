package containerdengine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testdata/shim.cmdline is /proc/PID/cmdline of the runc shim containerd
// 1.6.20 (dockerd's) started for a sandboxd exec job's task.
func TestParseShimCmdline(t *testing.T) {
	real, err := os.ReadFile("testdata/shim.cmdline")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := parseShimCmdline(real)
	want := shimProcess{namespace: "sandboxd", id: "sandboxd-cli-exec-4b4e57b7e10e-4d4e10209e63.3601f21f", address: "/var/run/docker/containerd/containerd.sock"}
	if !ok || p != want {
		t.Fatalf("the real shim's command line: got %+v %v, want %+v", p, ok, want)
	}
	args := func(a ...string) []byte { return []byte(strings.Join(a, "\x00") + "\x00") }
	const bin = "/usr/bin/containerd-shim-runc-v2"
	if p, ok := parseShimCmdline(args(bin, "-namespace", "ns", "-debug", "-id", "x", "-address", "/s")); !ok || p.id != "x" || p.namespace != "ns" || p.address != "/s" {
		t.Errorf("with -debug among the flags: %+v %v", p, ok)
	}
	if p, ok := parseShimCmdline(args(bin, "-address", "/s", "-id", "x", "-namespace", "ns")); !ok || p.id != "x" {
		t.Errorf("the flags in another order: %+v %v", p, ok)
	}
	for name, b := range map[string][]byte{
		// containerd 1.6's start and delete commands (runtime/v2/binary.go,
		// shim/util.go): they end by themselves and ignore SIGTERM.
		"the shim's start":     args(bin, "-namespace", "ns", "-address", "/s", "-publish-binary", "/usr/bin/containerd", "-id", "x", "start"),
		"the shim's delete":    args(bin, "-namespace", "ns", "-address", "/s", "-publish-binary", "/usr/bin/containerd", "-id", "x", "-bundle", "/b", "delete"),
		"a positional":         args(bin, "-namespace", "ns", "-id", "x", "-address", "/s", "start"),
		"another binary":       args("/usr/bin/containerd-shim-runc-v1", "-namespace", "ns", "-id", "x", "-address", "/s"),
		"a binary named so":    args("/tmp/containerd-shim-runc-v2x", "-namespace", "ns", "-id", "x", "-address", "/s"),
		"no id":                args(bin, "-namespace", "ns", "-address", "/s", "-debug"),
		"-debug twice":         args(bin, "-namespace", "ns", "-id", "x", "-address", "/s", "-debug", "-debug"),
		"an empty id":          args(bin, "-namespace", "ns", "-id", "", "-address", "/s"),
		"id given twice":       args(bin, "-namespace", "ns", "-id", "x", "-id", "y", "-address", "/s"),
		"a flag with no value": args(bin, "-namespace", "ns", "-address", "/s", "-debug", "-id"),
		"empty":                nil,
	} {
		if p, ok := parseShimCmdline(b); ok {
			t.Errorf("%s: taken for a shim: %+v", name, p)
		}
	}
}

func TestEngineID(t *testing.T) {
	for _, id := range []string{"sandboxd-cli-exec-4b4e57b7e10e-4d4e10209e63.3601f21f", newID("a-b-c"), newID(strings.Repeat("n", 100)), "a.b.0123abcd"} {
		if !engineID(id) {
			t.Errorf("%q: not taken for an ID of this engine", id)
		}
	}
	for _, id := range []string{"", "0123abcd", ".0123abcd", "x.0123ABCD", "x.0123abc", "x.0123abcde", "x-0123abcd", "pod-sandbox-id", "x.0123abcg"} {
		if engineID(id) {
			t.Errorf("%q: taken for an ID of this engine", id)
		}
	}
}

func TestProcessAge(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	young, err := processAge(cmd.Process.Pid)
	if err != nil || young < 0 || young > 2*time.Second {
		t.Errorf("a process just started: age %v, %v", young, err)
	}
	old, err := processAge(1)
	if err != nil || old < young {
		t.Errorf("process 1: age %v, %v; want more than %v", old, err, young)
	}
}

// statIn resolves a path as the process sees it: in its own mount
// namespace, and an absolute link from its root, not the caller's (a
// stat of /proc/PID/root/PATH follows such a link from the caller's).
func TestStatInResolvesInTheProcesssRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "target"), []byte("the caller's"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The child mounts a tmpfs over dir in its own namespace, with its own
	// target and a link to it by its absolute path, and says the target's
	// device and inode.
	script := fmt.Sprintf(`mount -t tmpfs tmpfs %[1]s && echo child > %[1]s/target && ln -s %[1]s/target %[1]s/link && stat -c '%%d %%i' %[1]s/target && exec sleep 30`, dir)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var dev, ino uint64
	if _, err := fmt.Fscan(out, &dev, &ino); err != nil {
		t.Fatalf("the child's target: %v", err)
	}
	fi, err := statIn(cmd.Process.Pid, filepath.Join(dir, "link"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Dev != dev || st.Ino != ino {
		t.Errorf("the link resolved to device %d inode %d, want the child's target %d %d", st.Dev, st.Ino, dev, ino)
	}
	// The test tells the two apart: through /proc/PID/root the link's
	// target is the caller's.
	if naive, err := os.Stat("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/root" + filepath.Join(dir, "link")); err != nil || os.SameFile(naive, fi) {
		t.Errorf("through /proc/PID/root: %v; want the caller's target, another file", err)
	}
}
