package containerdengine

import (
	"os"
	"strings"
	"testing"
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
	// The shim binary's start command (it starts the shim, then exits)
	// is a process of that container's task create too.
	if p, ok := parseShimCmdline(args(bin, "-namespace", "ns", "-id", "x", "-address", "/s", "-publish-binary", "/usr/bin/containerd", "start")); !ok || p.id != "x" {
		t.Errorf("the shim's start command: %+v %v", p, ok)
	}
	for name, b := range map[string][]byte{
		"another binary":       args("/usr/bin/containerd-shim-runc-v1", "-namespace", "ns", "-id", "x", "-address", "/s"),
		"a binary named so":    args("/tmp/containerd-shim-runc-v2x", "-namespace", "ns", "-id", "x", "-address", "/s"),
		"no id":                args(bin, "-namespace", "ns", "-address", "/s", "-debug", "-x"),
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
