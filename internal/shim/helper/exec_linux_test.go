package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// The test binary stands in for the helper binary in the children the
// helper starts of itself (self()), of other uids: as root, it runs from a
// copy those uids may execute (go test builds into a directory only root
// may enter), as the shim binary is mounted in a sandbox.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "collect" || os.Args[1] == "stage" || os.Args[1] == codeStart) {
		os.Exit(Main(os.Args))
	}
	if len(os.Args) > 1 && os.Args[1] == "clone3-after-filter" {
		os.Exit(clone3AfterFilter())
	}
	if os.Getuid() == 0 && os.Getenv("SANDBOXD_HELPER_TEST_COPY") == "" {
		if err := reexecFromCopy(); err != nil {
			fmt.Fprintln(os.Stderr, "helper test:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// reexecFromCopy runs this test binary again from a world-executable copy,
// removed when the copy ends.
func reexecFromCopy() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sandboxd-helper-test-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return err
	}
	cp := filepath.Join(dir, "helper.test")
	if err := os.WriteFile(cp, b, 0o755); err != nil {
		return err
	}
	cmd := exec.Command(cp, os.Args[1:]...)
	cmd.Env = append(os.Environ(), "SANDBOXD_HELPER_TEST_COPY=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		os.RemoveAll(dir)
		os.Exit(ee.ExitCode())
	}
	if err != nil {
		return err
	}
	os.RemoveAll(dir)
	os.Exit(0)
	return nil
}

// socketPair returns the two ends of a connected unix socket.
func socketPair(t *testing.T) (server, client *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// A client that goes away (a grader's `timeout` killed `shim exec`) takes
// its program with it, and what the program started in its session: they
// no longer hold the client's pipe open until the job's wall time.
func TestExecServiceEndsTheProgramWhenTheClientGoes(t *testing.T) {
	needRoot(t, "to run a program as the code uid")
	const codeUID = 3999921      // a uid no one on this host uses
	self, err := os.Executable() // the program starts through it (codeStart: TestMain)
	if err != nil {
		t.Fatal(err)
	}
	s := &execService{cfg: &shim.Config{CodeUID: codeUID, CodeGID: codeUID}, self: self, sem: make(chan struct{}, 1), done: make(chan struct{})}
	t.Cleanup(func() { killUID(codeUID) }) // what a failing run left
	srv, client := socketPair(t)
	served := make(chan struct{})
	go func() { defer close(served); s.serve(srv) }()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	// A program that hangs, and a child of it that would outlive it.
	req, _ := json.Marshal(ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 600 & exec sleep 600"}, Env: []string{"PATH=/bin:/usr/bin"}, Dir: "/"})
	if _, _, err := client.WriteMsgUnix(req, unix.UnixRights(int(devnull.Fd()), int(w.Fd()), int(w.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// The program runs (its uid has a process) before the client goes.
	for !anyAlive(codeUID) {
		select {
		case <-served:
			t.Fatal("the exec service ended before the program started")
		default:
			time.Sleep(time.Millisecond)
		}
	}
	client.Close()

	// A hang guard, not a measurement: without the kill, nothing ends.
	select {
	case <-served:
	case <-time.After(60 * time.Second):
		t.Fatalf("the client went away and its program still runs (uid %d alive: %v)", codeUID, anyAlive(codeUID))
	}
	if anyAlive(codeUID) {
		t.Errorf("a process of the program's session outlived the client")
	}
	// Every writer of the pipe is gone: the reader sees its end.
	if b, err := io.ReadAll(r); err != nil || len(b) != 0 {
		t.Errorf("the program's stdout: got %q, %v; want its end", b, err)
	}
}

// killUID kills every process of uid (the test's own, on a uid no one uses).
func killUID(uid int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 && f[0] == strconv.Itoa(uid) {
					unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
	}
}
