package seccomp

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	moby "github.com/moby/profiles/seccomp"
)

func TestCheckedInProfileIsGenerated(t *testing.T) {
	want, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(JSON(), want) {
		t.Fatal("sandboxd.json differs from Generate(); run `go generate ./profiles/seccomp`")
	}
}

func decode(t *testing.T) *moby.Seccomp {
	t.Helper()
	var p moby.Seccomp
	if err := json.Unmarshal(JSON(), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestDeniedSyscallsAreNotAllowed(t *testing.T) {
	p := decode(t)
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Fatalf("default action %q, want SCMP_ACT_ERRNO", p.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, r := range p.Syscalls {
		if r.Action == "SCMP_ACT_ALLOW" {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	for _, n := range append(slices.Clone(Denied), NotImplemented...) {
		if allowed[n] {
			t.Errorf("%s is allowed", n)
		}
	}
	for _, n := range []string{"read", "write", "execve", "clone", "setresuid", "kill", "socket", "wait4"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed; ordinary programs need it", n)
		}
	}
}

func TestClone3IsENOSYS(t *testing.T) {
	p := decode(t)
	for _, r := range p.Syscalls {
		if slices.Contains(r.Names, "clone3") {
			if r.Action != "SCMP_ACT_ERRNO" || r.ErrnoRet == nil || *r.ErrnoRet != 38 {
				t.Fatalf("clone3 rule %+v, want ERRNO 38", r)
			}
			return
		}
	}
	t.Fatal("no clone3 rule")
}

// The socket rules must be exactly upstream's: no AF_VSOCK (40), no AF_ALG (38).
func TestSocketFamiliesKeptFromUpstream(t *testing.T) {
	count := func(p *moby.Seccomp) (n int, families []uint64) {
		for _, r := range p.Syscalls {
			if slices.Equal(r.Names, []string{"socket"}) && r.Action == "SCMP_ACT_ALLOW" {
				n++
				for _, a := range r.Args {
					families = append(families, a.Value)
				}
			}
		}
		return
	}
	gotN, got := count(decode(t))
	wantN, want := count(moby.DefaultProfile())
	if gotN != wantN || !slices.Equal(got, want) {
		t.Fatalf("socket rules %d %v, want upstream's %d %v", gotN, got, wantN, want)
	}
	for _, f := range got {
		if f == 40 || f == 38 {
			t.Errorf("socket family %d allowed", f)
		}
	}
}

func TestNoCapabilityConditionalRules(t *testing.T) {
	for _, r := range decode(t).Syscalls {
		if r.Includes != nil && len(r.Includes.Caps) > 0 {
			t.Errorf("rule for %v depends on capabilities %v", r.Names, r.Includes.Caps)
		}
	}
}

func TestDigestIsStable(t *testing.T) {
	if Digest() != digestOf(JSON()) || len(Digest()) != 71 {
		t.Fatalf("digest %q", Digest())
	}
}

// Only the native ABI of each architecture is named: none of the
// compatibility ABIs (x86 and x32 on x86_64, …) that upstream adds.
func TestOnlyNativeABIs(t *testing.T) {
	p := decode(t)
	if len(p.ArchMap) == 0 {
		t.Fatal("the profile names no architecture")
	}
	for _, a := range p.ArchMap {
		if len(a.SubArches) != 0 {
			t.Errorf("%s: compatibility ABIs %v, want none", a.Arch, a.SubArches)
		}
	}
	if len(p.Architectures) != 0 {
		t.Errorf("architectures %v besides the map, want none", p.Architectures)
	}
}
