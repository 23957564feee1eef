package containerdengine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/identifiers"
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

// Every container gets an ID of its own, never used before, that
// containerd takes: its name and 8 random hex digits, the name cut (and
// no separator left at the cut) when the whole would pass 76 characters.
func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for _, name := range []string{
		"sandboxd-it-6292d26f-5e9ce8-it-a381b4a1-01cf42e06de3",
		strings.Repeat("a", 76),
		strings.Repeat("a", 66) + "-b.c_d-e-f",
		"x",
	} {
		for range 3 {
			id := newID(name)
			if err := identifiers.Validate(id); err != nil {
				t.Errorf("newID(%q) = %q: %v", name, id, err)
			}
			if seen[id] || id == name {
				t.Errorf("newID(%q) = %q, given before or the name itself", name, id)
			}
			seen[id] = true
			base, suffix, _ := strings.Cut(id[len(id)-9:], ".")
			if base != "" || len(suffix) != 8 || !strings.HasPrefix(name, id[:len(id)-9]) {
				t.Errorf("newID(%q) = %q, want a prefix of the name and 8 hex digits", name, id)
			}
		}
	}
}

// A container's stdio directory is made new: one that exists under the
// ID (another container's, were an ID ever drawn twice) is refused and
// left as it is.
func TestMakeIORefusesAnIDInUse(t *testing.T) {
	e := &Engine{cfg: Config{StateDir: t.TempDir()}}
	if err := os.MkdirAll(filepath.Join(e.cfg.StateDir, "io"), 0o700); err != nil {
		t.Fatal(err)
	}
	const id = "sandboxd-unit-1.0123abcd"
	if err := e.makeIO(id); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(e.ioDir(id), "stdout")
	if err := os.WriteFile(out, []byte("the first container's output"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.makeIO(id); err == nil {
		t.Fatal("a second makeIO of the same ID succeeded")
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "the first container's output" {
		t.Errorf("the first container's stdout after a refused makeIO: %q, %v", b, err)
	}
}
