package selfcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
)

// dockerVersion is this engine's answer to GET /version (Docker 20.10.24
// from Debian's packages), saved in testdata.
func dockerVersion(t *testing.T) client.ServerVersionResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "docker-version.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Version    string
		Components []system.ComponentVersion
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return client.ServerVersionResult{Version: v.Version, Components: v.Components}
}

// withBoot points the boot id at a file holding id for one test.
func withBoot(t *testing.T, id string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := bootIDPath
	bootIDPath = p
	t.Cleanup(func() { bootIDPath = old })
}

func TestHostKeyNamesDockersPartsAndKernel(t *testing.T) {
	withBoot(t, "6f0e4d1c-0000-4000-8000-000000000001")
	k, err := hostOf(dockerVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	if k.KernelVersion != "6.18.44-fc-v1272" {
		t.Errorf("kernel %q, want Docker's", k.KernelVersion)
	}
	// The runc part with Debian's revision: a security rebuild keeps
	// 1.1.5+ds1 and changes the revision.
	for _, want := range []string{"runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1)", "containerd 1.6.20~ds1 (1.6.20~ds1-1+deb12u3)", "docker-init 0.19.0"} {
		if !strings.Contains(k.Components, want) {
			t.Errorf("components %q lack %q", k.Components, want)
		}
	}
	if k.BootID != "6f0e4d1c-0000-4000-8000-000000000001" {
		t.Errorf("boot %q", k.BootID)
	}
}

// containerd says nothing of its kernel: the key holds this host's, which
// is the one containerd's tasks run on.
func TestHostKeyOfContainerdIsThisHostsKernel(t *testing.T) {
	v := client.ServerVersionResult{Version: "containerd 1.6.20~ds1", APIVersion: "containerd/1.6.20~ds1"}
	v.Platform.Name = "containerd"
	k, err := hostOf(v)
	if err != nil {
		t.Fatal(err)
	}
	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(k.KernelVersion, strings.TrimSpace(string(release))+" #") {
		t.Errorf("kernel %q, want this host's release and build", k.KernelVersion)
	}
	if k.BootID == "" {
		t.Error("no boot id")
	}
}

// A pass cached before a reboot is not one after it: the boot can change
// what the kernel allows (boot options) under the same versions.
func TestAPassIsNotKeptAcrossABoot(t *testing.T) {
	o := Options{StateDir: t.TempDir()}
	withBoot(t, "11111111-1111-4111-8111-111111111111")
	before, err := hostOf(dockerVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	before.Image, before.ProbeDigest = "sha256:bb", "sha256:cc"
	if err := o.store(&Report{Schema: ReportSchema, Key: before, OK: true, Properties: []Property{{Name: "x", OK: true}}}); err != nil {
		t.Fatal(err)
	}
	withBoot(t, "22222222-2222-4222-8222-222222222222")
	after, err := hostOf(dockerVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	after.Image, after.ProbeDigest = "sha256:bb", "sha256:cc"
	if _, ok := o.cached(after); ok {
		t.Fatal("a pass of the earlier boot answered after a reboot")
	}
	if _, ok := o.cached(before); !ok {
		t.Fatal("the pass was not cached for its own boot (the test checks nothing)")
	}
}

// No boot to read, no key: nothing is answered from the cache or cached.
func TestHostKeyWithoutABootFails(t *testing.T) {
	old := bootIDPath
	bootIDPath = filepath.Join(t.TempDir(), "none")
	t.Cleanup(func() { bootIDPath = old })
	if _, err := hostOf(dockerVersion(t)); err == nil {
		t.Fatal("a key without the host's boot")
	}
	withBoot(t, "")
	if _, err := hostOf(dockerVersion(t)); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty boot id: %v", err)
	}
}

// Storing a pass removes the passes cached under another boot (they can
// never be answered again), and keeps this boot's others and files that
// are not passes of a boot.
func TestStoringAPassPrunesOtherBoots(t *testing.T) {
	o := Options{StateDir: t.TempDir()}
	pass := func(boot, image string) Key {
		k := Key{BootID: boot, Image: image, ProbeDigest: "sha256:cc"}
		if err := o.store(&Report{Schema: ReportSchema, Key: k, OK: true, Properties: []Property{{Name: "x", OK: true}}}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	earlier := pass("boot-1", "sha256:b1")
	dir := filepath.Dir(o.cachePath(earlier))
	stray := filepath.Join(dir, "notes.json")
	if err := os.WriteFile(stray, []byte("not a report"), 0o600); err != nil {
		t.Fatal(err)
	}
	now1 := pass("boot-2", "sha256:b1")
	now2 := pass("boot-2", "sha256:b2")
	if _, err := os.Stat(o.cachePath(earlier)); !os.IsNotExist(err) {
		t.Errorf("the earlier boot's pass: %v, want it removed", err)
	}
	for _, k := range []Key{now1, now2} {
		if _, ok := o.cached(k); !ok {
			t.Errorf("this boot's pass for %s is gone", k.Image)
		}
	}
	if _, err := os.Stat(stray); err != nil {
		t.Errorf("a file that is no pass: %v, want it left", err)
	}
}

// A part the engine could not identify (a binary it could not find or
// read) is in the key, and no pass is kept or answered for such a key:
// nothing in it would tell that binary replaced.
func TestAKeyWithAnUnknownPartIsNeverCached(t *testing.T) {
	withBoot(t, "6f0e4d1c-0000-4000-8000-000000000002")
	v := client.ServerVersionResult{Version: "containerd 1.6.20~ds1", Components: []system.ComponentVersion{
		{Name: "containerd", Version: "1.6.20~ds1"},
		{Name: "runtime runc", Version: "unknown: containerd runs in another mount namespace", Details: map[string]string{"Unknown": "unknown: containerd runs in another mount namespace"}},
	}}
	k, err := hostOf(v)
	if err != nil {
		t.Fatal(err)
	}
	if k.Unknown != "runtime runc: unknown: containerd runs in another mount namespace" {
		t.Fatalf("unknown %q", k.Unknown)
	}
	o := Options{StateDir: t.TempDir()}
	r := &Report{Schema: ReportSchema, Key: k, OK: true}
	if err := o.store(r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.cachePath(k)); !os.IsNotExist(err) {
		t.Fatalf("a pass was kept for a key with an unknown part: %v", err)
	}
	// Nor answered, were one there.
	os.MkdirAll(filepath.Dir(o.cachePath(k)), 0o700)
	b, _ := json.Marshal(r)
	os.WriteFile(o.cachePath(k), b, 0o600)
	if _, ok := o.cached(k); ok {
		t.Fatal("a kept pass answered for a key with an unknown part")
	}
	k.Unknown = ""
	r.Key = k
	if err := o.store(r); err != nil {
		t.Fatal(err)
	}
	if _, ok := o.cached(k); !ok {
		t.Fatal("a key with every part known was not cached")
	}
}
