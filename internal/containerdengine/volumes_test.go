package containerdengine

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A volume's directory is the engine's own, under StateDir/volumes; a name
// that could reach elsewhere is refused.
func TestVolumeDirectories(t *testing.T) {
	e := testEngine()
	for _, name := range []string{"b-input-2", "sandboxd-shim-" + "0123456789abcdef", "a", "A.b_c-d", strings.Repeat("v", 201)} {
		dir, err := e.volumeData(name)
		if want := filepath.Join(e.cfg.StateDir, "volumes", name, "_data"); err != nil || dir != want {
			t.Errorf("volumeData(%q): got %q, %v; want %q", name, dir, err, want)
		}
	}
	for _, name := range []string{"", ".", "..", "../etc", "a/b", "/abs", ".hidden", "-x", "a b", strings.Repeat("v", 202)} {
		if dir, err := e.volumeDir(name); !errdefs.IsInvalidArgument(err) {
			t.Errorf("volumeDir(%q): got %q, %v; want an invalid argument", name, dir, err)
		}
	}
}

// Copies reach a container's volumes only: a path is resolved to the
// volume mounted deepest above it, and a path on no volume (the root, a
// tmpfs, a base mount, a bind from elsewhere) is not implemented.
func TestVolumeAt(t *testing.T) {
	e := testEngine()
	vol := func(name string) string {
		d, err := e.volumeData(name)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	s := &specs.Spec{Mounts: append(append([]specs.Mount{}, baseMounts...),
		specs.Mount{Destination: "/work", Type: "tmpfs", Source: "tmpfs", Options: []string{"size=1k"}},
		specs.Mount{Destination: "/bundle", Type: "bind", Source: vol("b-input-2"), Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/bundle/inner", Type: "bind", Source: vol("b-inner-3"), Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind", "ro"}},
	)}
	for _, tc := range []struct {
		path, dir, rel, target string
	}{
		{"/bundle", vol("b-input-2"), "", "/bundle"},
		{"bundle/", vol("b-input-2"), "", "/bundle"},
		{"/bundle/a/b.txt", vol("b-input-2"), "a/b.txt", "/bundle"},
		{"/bundle/./a/../c", vol("b-input-2"), "c", "/bundle"},
		{"/bundle/inner/x", vol("b-inner-3"), "x", "/bundle/inner"},
		{"/bundle/innerx", vol("b-input-2"), "innerx", "/bundle"},
	} {
		dir, rel, target, err := e.volumeAt(s, tc.path)
		if err != nil || dir != tc.dir || rel != tc.rel || target != tc.target {
			t.Errorf("volumeAt(%q): got %q %q %q, %v; want %q %q %q", tc.path, dir, rel, target, err, tc.dir, tc.rel, tc.target)
		}
	}
	for _, p := range []string{"/", "/work/x", "/proc/self", "/host/etc/passwd", "/bundle/../etc/passwd", "/bundl", "/etc"} {
		if dir, _, _, err := e.volumeAt(s, p); !errdefs.IsNotImplemented(err) {
			t.Errorf("volumeAt(%q): got %q, %v; want not implemented", p, dir, err)
		}
	}
}

// A "label" filter term is "key" (the label is set) or "key=value"; every
// term must hold.
func TestMatchLabels(t *testing.T) {
	labels := map[string]string{"sandboxd.role": "job", "sandboxd.broker": "b", "empty": ""}
	for _, tc := range []struct {
		filter client.Filters
		want   bool
	}{
		{client.Filters{}, true},
		{make(client.Filters).Add("label", "sandboxd.role=job"), true},
		{make(client.Filters).Add("label", "sandboxd.role"), true},
		{make(client.Filters).Add("label", "empty="), true},
		{make(client.Filters).Add("label", "empty"), true},
		{make(client.Filters).Add("label", "sandboxd.role=job", "sandboxd.broker=b"), true},
		{make(client.Filters).Add("label", "sandboxd.role=pool"), false},
		{make(client.Filters).Add("label", "sandboxd.role=job", "sandboxd.broker=other"), false},
		{make(client.Filters).Add("label", "missing"), false},
		{make(client.Filters).Add("label", "sandboxd.role=jo"), false},
		{make(client.Filters).Add("name", "x"), true}, // other filters are not labels
	} {
		if got := matchLabels(labels, labelTerms(tc.filter)); got != tc.want {
			t.Errorf("filter %v: got %v, want %v", tc.filter, got, tc.want)
		}
	}
}

// A volume's name is at most 201 bytes of its grammar.
func TestVolumeNamesBoundTheirLength(t *testing.T) {
	e := &Engine{cfg: Config{StateDir: t.TempDir()}}
	if _, err := e.volumeDir("v" + strings.Repeat("x", 200)); err != nil {
		t.Errorf("a name of 201 bytes: %v", err)
	}
	for _, bad := range []string{"v" + strings.Repeat("x", 201), "", ".v", "v/x", "v x"} {
		if _, err := e.volumeDir(bad); err == nil {
			t.Errorf("name %q taken", bad)
		}
	}
}
