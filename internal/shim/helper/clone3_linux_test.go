package helper

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// clone3AfterFilter runs in a child of the test: it calls clone3 with no
// arguments (EINVAL where clone3 is allowed: size 0), installs the helper's
// filter under no_new_privs, as in a sandbox, and calls it again. It prints
// both errnos, and that getpid still works.
func clone3AfterFilter() int {
	try := func() string {
		_, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
		return unix.ErrnoName(e)
	}
	before := try()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("prctl:", err)
		return 1
	}
	if err := denyClone3(); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Printf("before=%s after=%s getpid=%v\n", before, try(), unix.Getpid() == os.Getpid())
	return 0
}

// The helper's filter turns clone3 into ENOSYS for everything it starts,
// whatever the runtime made of the profile's errno (runsc answers EPERM),
// and touches no other system call.
func TestDenyClone3(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "clone3-after-filter").CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "before=EINVAL after=ENOSYS getpid=true"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// A TSYNC install that names a thread it could not synchronise installed
// nothing: that is a failure, not a filter.
func TestSeccompInstalledRefusesAnUnsyncedThread(t *testing.T) {
	if err := seccompInstalled(0, 0); err != nil {
		t.Errorf("installed: %v", err)
	}
	if err := seccompInstalled(4242, 0); err == nil || !strings.Contains(err.Error(), "thread 4242") {
		t.Errorf("thread 4242 not synchronised: got %v, want an error naming it", err)
	}
	if err := seccompInstalled(0, unix.EACCES); err == nil {
		t.Error("EACCES: got no error")
	}
}
