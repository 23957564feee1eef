package containerdengine

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandboxd/sandboxd/internal/broker"
)

// The engine is the broker's: every method the broker calls, and the
// broker's admission check of a container's name.
var (
	_ broker.Engine      = (*Engine)(nil)
	_ broker.NameChecker = (*Engine)(nil)
)

// The default configuration is valid as it is (it names no hook: the
// engine runs none); each field that would put the engine in dockerd's
// namespace or leave it without its state directory or snapshotter is
// refused, naming that field.
func TestConfigValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default(): %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string // in the error
	}{
		{"dockerd's namespace", func(c *Config) { c.Namespace = "moby" }, "moby"},
		{"empty namespace", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"upper-case namespace", func(c *Config) { c.Namespace = "Sandboxd" }, "namespace"},
		{"namespace with a slash", func(c *Config) { c.Namespace = "a/b" }, "namespace"},
		{"namespace of 64 characters", func(c *Config) { c.Namespace = strings.Repeat("a", 64) }, "namespace"},
		{"relative state directory", func(c *Config) { c.StateDir = "var/lib/sandboxd" }, "state directory"},
		{"no state directory", func(c *Config) { c.StateDir = "" }, "state directory"},
		{"no snapshotter", func(c *Config) { c.Snapshotter = "" }, "Snapshotter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate(%+v): got %v, want an error naming %s", c, err, tc.want)
			}
		})
	}
	long := Default()
	long.Namespace = strings.Repeat("a", 63)
	if err := long.Validate(); err != nil {
		t.Errorf("a namespace of 63 characters: %v", err)
	}
}

// The names the broker gives its containers are accepted; a name
// containerd cannot hold is refused as an invalid argument at admission,
// before any receipt names it.
func TestCheckContainerName(t *testing.T) {
	e := testEngine()
	for _, name := range []string{
		broker.ContainerName("sandboxd", "job-1", "sha256:"+strings.Repeat("ab", 32)),
		"sandboxd-populate-0123456789ab",
		strings.Repeat("a", 76),
	} {
		if err := e.CheckContainerName(name); err != nil {
			t.Errorf("CheckContainerName(%q): %v", name, err)
		}
	}
	for _, name := range []string{
		strings.Repeat("a", 77),
		"", "-leading", "trailing-", "doubled--separator", "a/b", "a b", "../etc",
	} {
		if err := e.CheckContainerName(name); !errdefs.IsInvalidArgument(err) {
			t.Errorf("CheckContainerName(%q): got %v, want an invalid argument", name, err)
		}
	}
}

// A task's create that fails on the bundle directory an earlier create
// of the same container ID still holds is told apart by containerd's
// answer (as containerd 1.6 gave it, CI): only for that ID.
func TestBundleTaken(t *testing.T) {
	const id = "sandboxd-it-6292d26f-5e9ce8-it-a381b4a1-01cf42e06de3"
	answer := errors.New("failed to start shim: mkdir /var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/sandboxd/" + id + ": file exists: unknown")
	if !bundleTaken(answer, id) {
		t.Errorf("containerd's answer %q: not read as the bundle taken", answer)
	}
	for _, other := range []string{"x" + id, id[:len(id)-1], "sandboxd-it-other"} {
		if bundleTaken(answer, other) {
			t.Errorf("the bundle of %s read as taken for %s", id, other)
		}
	}
	if bundleTaken(nil, id) || bundleTaken(errors.New("failed to start shim: exec: no such file"), id) {
		t.Error("another failure read as the bundle taken")
	}
}
