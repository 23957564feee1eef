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
		"no id":                args(bin, "-namespace", "ns", "-address", "/s", "-debug", "-debug"),
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
