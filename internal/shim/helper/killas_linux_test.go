package helper

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// killAllOf kills from a thread of the helper that takes the uid for the
// call: it reaches that uid's processes and no other's, root's included,
// and leaves every thread root again. kill(-1) reaches every process the
// sender may signal, so the test runs in a pid namespace of its own (with
// its own /proc), as the helper does in a sandbox.
func TestKillAllOfKillsOnlyThatUID(t *testing.T) {
	needRoot(t, "to make a pid namespace and start processes as other uids")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillAllOfInNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), "SANDBOXD_TEST_KILL_NAMESPACE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestKillAllOfInNamespace") {
		t.Fatalf("in a pid namespace: %v\n%s", err, out)
	}
}

// TestKillAllOfInNamespace is TestKillAllOfKillsOnlyThatUID's half inside
// the pid namespace, where it is pid 1.
func TestKillAllOfInNamespace(t *testing.T) {
	if os.Getenv("SANDBOXD_TEST_KILL_NAMESPACE") != "1" {
		t.Skip("run by TestKillAllOfKillsOnlyThatUID in a pid namespace")
	}
	if os.Getpid() != 1 {
		t.Fatalf("pid %d, want 1 in a new pid namespace", os.Getpid())
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		t.Fatal(err)
	}
	const target, other = 3999921, 3999922
	start := func(uid uint32) *exec.Cmd {
		cmd := exec.Command("/bin/sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	killed := func(cmd *exec.Cmd) bool {
		t.Helper()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			return ws.Signal() == syscall.SIGKILL
		case <-time.After(10 * time.Second): // a hang guard, not a measurement
			return false
		}
	}
	alive := func(cmd *exec.Cmd) bool {
		return cmd.Process.Signal(syscall.Signal(0)) == nil && cmd.ProcessState == nil
	}

	// Only init (this test) is root: kill(-1) from the thread.
	victim, bystander := start(target), start(other)
	if solo, err := onlyRootIsInitAndMe(); err != nil || !solo {
		t.Fatalf("onlyRootIsInitAndMe: got %v, %v; want true with no other root process", solo, err)
	}
	for range 10 { // on whichever threads the runtime gives
		if err := killAllOf(target); err != nil {
			t.Fatal(err)
		}
	}
	if !killed(victim) {
		t.Error("kill(-1): the target uid's process was not killed")
	}
	if !alive(bystander) {
		t.Error("kill(-1): a process of another uid was killed")
	}

	// Another root process is there: each process of the uid by its pid,
	// and root's process is spared.
	victim, root := start(target), start(0)
	if solo, err := onlyRootIsInitAndMe(); err != nil || solo {
		t.Fatalf("onlyRootIsInitAndMe: got %v, %v; want false beside another root process", solo, err)
	}
	if err := killAllOf(target); err != nil {
		t.Fatal(err)
	}
	if !killed(victim) {
		t.Error("by pid: the target uid's process was not killed")
	}
	if !alive(root) || !alive(bystander) {
		t.Error("by pid: a root process or one of another uid was killed")
	}

	if err := killAllOf(0); err == nil {
		t.Error("killAllOf(0) was accepted: it must never kill as root")
	}
	// Every thread is root again: none keeps the candidate's uid.
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("list threads: %v", err)
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && strings.Join(strings.Fields(v), " ") != "0 0 0 0" {
				t.Errorf("%s: Uid %q after the kill, want 0 0 0 0", p, strings.TrimSpace(v))
			}
		}
	}
}
