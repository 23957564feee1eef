package hostile

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/selfcheck"
	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

// hostile is one named hostile candidate: a command, the job around it,
// and the exact outcome it must end in.
type hostile struct {
	name  string
	argv  []string
	probe bool                                 // mount the probe at /inputs/probe
	mod   func(t *testing.T, j *sandbox.Job)   // limits, inputs
	check func(t *testing.T, r sandbox.Result) // status, exit code, observation
}

func sh(script string) []string { return testharness.Sh(script) }

func want(t *testing.T, r sandbox.Result, status sandbox.Status, exit int) {
	t.Helper()
	if r.Status != status || r.ExitCode != exit {
		t.Fatalf("got status %s exit %d (cause %q, limit %q, stderr %q), want %s exit %d",
			r.Status, r.ExitCode, r.Cause, r.Limit, logOf(t, r.Stderr), status, exit)
	}
}

// wantPidsLimit checks the result of a job that filled its pids limit:
// limit_exceeded (pids) with the command's exit code, where the pids
// cgroup tells the helper of a refused fork. On gVisor the limit is
// RLIMIT_NPROC, which leaves no count: the command's own status there.
func wantPidsLimit(t *testing.T, r sandbox.Result, onRunscStatus sandbox.Status, exit int) {
	t.Helper()
	if onRunsc() {
		want(t, r, onRunscStatus, exit)
		return
	}
	want(t, r, sandbox.StatusLimitExceeded, exit)
	if r.Limit != "pids" {
		t.Fatalf("got limit %q (limits hit %v), want pids", r.Limit, r.LimitsHit)
	}
}

// logOf returns a captured log, or "" when none was captured (a job that
// never ran).
func logOf(t *testing.T, l sandbox.Log) string {
	t.Helper()
	if l.Digest == "" {
		return ""
	}
	return string(env.Blob(t, l.Digest))
}

func wantLimit(t *testing.T, r sandbox.Result, limit string, exit int) {
	t.Helper()
	want(t, r, sandbox.StatusLimitExceeded, exit)
	if r.Limit != limit {
		t.Fatalf("got limit %q, want %q", r.Limit, limit)
	}
}

func wantStdout(t *testing.T, r sandbox.Result, lines ...string) {
	t.Helper()
	out := env.Stdout(t, r)
	for _, l := range lines {
		if !strings.Contains(out, l) {
			t.Errorf("stdout lacks %q:\n%s", l, out)
		}
	}
}

func wantNoArtifacts(t *testing.T, r sandbox.Result) {
	t.Helper()
	if len(r.Artifacts) != 0 {
		t.Errorf("got artifacts %+v, want none", r.Artifacts)
	}
}

// bomb is the probe's report for fork, fd, zombie and file bombs.
type bomb struct {
	Count int    `json:"count"`
	Errno string `json:"errno"`
}

// syscallCase runs the probe's attempt of one denied syscall.
func syscallCase(name, errno string) hostile {
	return hostile{
		name: "syscall-" + name, probe: true, argv: []string{probePath, "syscall", name},
		check: func(t *testing.T, r sandbox.Result) {
			want(t, r, sandbox.StatusSucceeded, 0)
			var got struct{ Syscalls []probe.Attempt }
			decode(t, r, &got)
			if len(got.Syscalls) != 1 || got.Syscalls[0].Errno != errno {
				t.Fatalf("got %+v, want %s failing with %s", got.Syscalls, name, errno)
			}
		},
	}
}

func socketCase(label string, names ...string) hostile {
	return hostile{
		name: "socket-" + label, probe: true, argv: append([]string{probePath, "socket"}, names...),
		check: func(t *testing.T, r sandbox.Result) {
			want(t, r, sandbox.StatusSucceeded, 0)
			var got struct{ Sockets []probe.Attempt }
			decode(t, r, &got)
			if len(got.Sockets) != len(names) {
				t.Fatalf("got %+v, want %d attempts", got.Sockets, len(names))
			}
			for _, a := range got.Sockets {
				if a.Errno != "EPERM" {
					t.Errorf("socket %s: got errno %q, want EPERM", a.Name, a.Errno)
				}
			}
		},
	}
}

// tarOf builds an input tar from headers and bodies, for inputs PutTree
// cannot express (modes, owners, hostile names).
func tarOf(t *testing.T, entries ...tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		e.h.Size = int64(len(e.body))
		if e.h.Typeflag == 0 {
			e.h.Typeflag = tar.TypeReg
		}
		if e.h.Typeflag != tar.TypeReg {
			e.h.Size = 0
		}
		if err := tw.WriteHeader(&e.h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	d, err := env.Blobs.PutBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type tarEntry struct {
	h    tar.Header
	body []byte
}

// onRunsc says whether the suite's jobs run on gVisor, whose kernel shows
// some of the same isolation in its own form: the cases that differ say
// how, and judge exactly that form there.
func onRunsc() bool { return env.Runtime == sandbox.RuntimeRunsc }

func hostileCases() []hostile {
	// gVisor's tmpfs keeps each file in the sentry's memory, charged to the
	// job's memory limit: a million empty files exceed 1 GiB there (the job
	// ends oom_killed, contained), so the collector's cap meets 2×10^5.
	manyFiles := 1000000
	if onRunsc() {
		manyFiles = 200000
	}
	return []hostile{
		// --- resource bombs ---
		{
			name: "fork-bomb-probe", probe: true, argv: []string{probePath, "forkbomb"},
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.Pids = 32 },
			check: func(t *testing.T, r sandbox.Result) {
				wantPidsLimit(t, r, sandbox.StatusSucceeded, 0)
				var b bomb
				decode(t, r, &b)
				if b.Errno != "EAGAIN" || b.Count >= 32 || b.Count < 10 {
					t.Fatalf("got %d children then %q, want 10-31 children then EAGAIN (pids limit 32)", b.Count, b.Errno)
				}
			},
		},
		{
			// The shell forks once, the bomb's first process, and exits 7
			// without forking again: `b; exit 7` forked twice (once per
			// side of the pipe) and lost the second fork to the bomb's
			// first side now and then (exit 2, "can't fork").
			name: "fork-bomb-shell", argv: sh(`b(){ b | b & }; b & exit 7`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.Pids = 32 },
			check: func(t *testing.T, r sandbox.Result) {
				// The helper kills every process the bomb left before it
				// collects. The shell may exit before the bomb fills the
				// pids limit, or after.
				if r.Status == sandbox.StatusLimitExceeded {
					wantPidsLimit(t, r, sandbox.StatusFailed, 7)
					return
				}
				want(t, r, sandbox.StatusFailed, 7)
			},
		},
		{
			// A flat bomb keeps the pids cgroup full until the shell
			// dies of a refused fork (busybox sh exits 2): the helper's
			// kill must need no pid of its own (it went through a child
			// that found none: "candidate processes survived SIGKILL").
			name: "flat-bomb", argv: sh(`while :; do sleep 1000 & done`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.Pids = 32 },
			check: func(t *testing.T, r sandbox.Result) {
				wantPidsLimit(t, r, sandbox.StatusFailed, 2)
			},
		},
		{
			name: "memory-bomb", argv: sh(`x=$(head -c 200000000 /dev/zero | tr '\0' a); echo survived`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.MemoryBytes = 32 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				if r.Status != sandbox.StatusOOMKilled {
					t.Fatalf("got status %s exit %d (%s), want oom_killed", r.Status, r.ExitCode, r.Cause)
				}
				if strings.Contains(env.Stdout(t, r), "survived") {
					t.Error("the shell survived a 200 MB allocation under a 32 MiB limit")
				}
			},
		},
		{
			// The candidate's program, run by a grader through the exec
			// service, allocates past the job's memory: the kernel kills
			// it, the grader judges its end, and the job is the grader's
			// (it was oom_killed by the engine's word, which made a wrong
			// candidate's run inconclusive).
			name: "exec-memory-bomb", argv: sh(`/.sandboxd/shim exec /bin/sh -c 'x=$(head -c 200000000 /dev/zero | tr "\0" a); echo survived'; echo "code=$?"; exit 3`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.MemoryBytes = 64 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				if onRunsc() {
					// gVisor ends a sandbox over its memory whole.
					if r.Status != sandbox.StatusOOMKilled {
						t.Fatalf("got status %s exit %d (%s), want oom_killed on gVisor", r.Status, r.ExitCode, r.Cause)
					}
					return
				}
				want(t, r, sandbox.StatusFailed, 3)
				wantStdout(t, r, "code=137\n")
			},
		},
		{
			// The same with a crowd: the program forks children of 8 MB
			// each past the job's memory. The code uid's programs have the
			// higher oom_score_adj, so the kernel kills them before the
			// helper or the grader (at one score for all, it killed the
			// biggest, the helper: no status, the job oom_killed).
			name: "exec-memory-crowd", argv: sh(`echo "grader=$(cat /proc/self/oom_score_adj)"
				/.sandboxd/shim exec /bin/sh -c 'echo "code=$(cat /proc/self/oom_score_adj)"; for i in $(seq 40); do (x=$(head -c 8000000 /dev/zero | tr "\0" a); sleep 100) & done; sleep 5; echo spawned'
				echo after; exit 3`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.MemoryBytes = 128 << 20; j.Limits.Pids = 256 },
			check: func(t *testing.T, r sandbox.Result) {
				if onRunsc() {
					// gVisor ends a sandbox over its memory whole.
					if r.Status != sandbox.StatusOOMKilled && r.Status != sandbox.StatusFailed {
						t.Fatalf("got status %s exit %d (%s), want oom_killed or failed on gVisor", r.Status, r.ExitCode, r.Cause)
					}
					return
				}
				want(t, r, sandbox.StatusFailed, 3)
				wantStdout(t, r, "grader=500\ncode=1000\n", "after\n")
			},
		},
		{
			name: "dev-shm-bomb", argv: sh(`dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null; echo "dd=$?"; ls /dev/shm >/dev/null 2>&1; echo "ls=$?"
				echo "shm=$(stat -c '%u %a' /dev/shm 2>/dev/null) $(ls -A /dev/shm 2>/dev/null | wc -l)"`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				if onRunsc() {
					// gVisor's /dev always has shm: an empty directory
					// only root (the helper) may write.
					wantStdout(t, r, "dd=1\n", "ls=0\n", "shm=0 755 0\n")
					return
				}
				wantStdout(t, r, "dd=1\n", "ls=1\n") // IpcMode none: there is no /dev/shm
			},
		},
		{
			name: "tmpfs-bomb-tmp", argv: sh(`dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>/dev/null; echo "dd=$?"`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.DiskBytes = 8 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				wantLimit(t, r, "disk_bytes", 0)
				wantStdout(t, r, "dd=1\n")
				if r.Usage.TmpBytesUsed > 8<<20 || r.Usage.TmpBytesUsed < 7<<20 {
					t.Errorf("got /tmp use %d bytes, want the 8 MiB bound filled", r.Usage.TmpBytesUsed)
				}
			},
		},
		{
			name: "file-size-bomb", argv: []string{"/bin/dd", "if=/dev/zero", "of=/work/big", "bs=1M", "count=4"},
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.FileSize = 1 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				// The command itself dies of SIGXFSZ (128+25).
				wantLimit(t, r, "file_size_bytes", 153)
			},
		},
		{
			name: "file-size-bomb-child", argv: sh(`dd if=/dev/zero of=/work/big bs=1M count=4 2>/dev/null; echo "dd=$?"; stat -c %s /work/big`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.FileSize = 1 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				// Contained: the child dies of SIGXFSZ at 1 MiB, the shell
				// exits 0, and the limit is still recorded (a scratch file
				// reached RLIMIT_FSIZE), so a report cut short by it can
				// never look complete.
				wantLimit(t, r, "file_size_bytes", 0)
				if got := env.Stdout(t, r); got != "dd=153\n1048576\n" {
					t.Fatalf("got %q, want dd killed by SIGXFSZ with the file at 1 MiB", got)
				}
			},
		},
		{
			// The candidate's program, run by a grader through the exec
			// service, writes a file exactly at the limit (a legal write):
			// the grader's job keeps its own outcome, not limit_exceeded.
			name: "file-size-limit-by-code-uid", argv: sh(`/.sandboxd/shim exec /bin/dd if=/dev/zero of=/.code-tmp/big bs=1M count=1 2>/dev/null; echo "dd=$?"; exit 1`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.FileSize = 1 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusFailed, 1)
				wantStdout(t, r, "dd=0\n")
			},
		},
		{
			// A program the grader runs through the exec service (the code
			// uid) can write neither /tmp nor /work, the grader's scratch
			// space: it cannot fill it (a full one made a right candidate's
			// run inconclusive: candidates fill of examples/go-cli and
			// examples/python) nor change what the grader keeps there,
			// but in a directory the grader opened to it. Its $TMPDIR is a
			// tmpfs of its own, bounded to an eighth of the job's memory,
			// which it fills without touching the grader's.
			name: "code-uid-scratch-of-its-own", argv: sh(`echo grader > /tmp/mine; mkdir /tmp/d && chmod 777 /tmp/d
				/.sandboxd/shim exec /bin/sh -c 'touch /tmp/x 2>/dev/null; echo "tmp=$?"; touch /tmp/d/x 2>/dev/null; echo "tmp-d=$?"; touch /work/x 2>/dev/null; echo "work=$?"; echo "dir=$TMPDIR"; dd if=/dev/zero of=$TMPDIR/fill bs=1M count=64 2>/dev/null; echo "dd=$?"'
				echo "mine=$(cat /tmp/mine) mode=$(stat -c %a /tmp)"`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.MemoryBytes = 256 << 20; j.Limits.DiskBytes = 64 << 20 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				// /tmp/d: the grader's choice to share.
				wantStdout(t, r, "tmp=1\n", "tmp-d=0\n", "work=1\n", "dir=/.code-tmp\n", "dd=1\n", "mine=grader mode=1775\n")
				if r.Usage.TmpBytesUsed > 1<<20 {
					t.Errorf("/tmp use %d bytes: the code uid's fill reached the grader's scratch space", r.Usage.TmpBytesUsed)
				}
			},
		},
		{
			// The candidate's program, run through the exec service,
			// detaches (a session of its own) keeping the grader's pipe:
			// the end of the call kills it, so the grader's pipe ends and
			// the grader's outcome stands. It held the grader until wall
			// time (timed_out: inconclusive, the candidate's choice).
			name: "exec-detach-holds-pipe", argv: sh(`/.sandboxd/shim exec /bin/sh -c 'setsid /bin/sh -c "sleep 1000" & echo started' | cat; echo "left=$(for f in /proc/[0-9]*/status; do grep -q '^Uid:[[:space:]]*65533[[:space:]]' $f 2>/dev/null && ! grep -q '^State:[[:space:]]*[ZX]' $f 2>/dev/null && echo x; done | wc -l)"; exit 3`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.WallTimeMS = 15_000 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusFailed, 3)
				wantStdout(t, r, "started\nleft=0\n")
			},
		},
		{
			// The same, the detached process keeping itself in a call of
			// its own: it is not in that call's session.
			name: "exec-detach-calls-service", argv: sh(`/.sandboxd/shim exec /bin/sh -c 'setsid /bin/sh -c "/.sandboxd/shim exec /bin/sleep 1000" & sleep 0.5; echo started' | cat; echo "left=$(for f in /proc/[0-9]*/status; do grep -q '^Uid:[[:space:]]*65533[[:space:]]' $f 2>/dev/null && ! grep -q '^State:[[:space:]]*[ZX]' $f 2>/dev/null && echo x; done | wc -l)"; exit 3`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.WallTimeMS = 15_000 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusFailed, 3)
				wantStdout(t, r, "started\nleft=0\n")
			},
		},
		{
			// The candidate's program, run through the exec service,
			// starts a fork bomb whose every process forks without end,
			// each child in a session of its own, and returns: the end of
			// the call leaves none of them, and the grader forks again.
			name: "exec-detached-fork-bomb", argv: sh(`printf 'while :; do setsid /bin/sh /tmp/b.sh & done\n' > /tmp/b.sh
				/.sandboxd/shim exec /bin/sh -c 'setsid /bin/sh /tmp/b.sh & sleep 1; echo started'
				echo "left=$(for f in /proc/[0-9]*/status; do grep -q '^Uid:[[:space:]]*65533[[:space:]]' $f 2>/dev/null && ! grep -q '^State:[[:space:]]*[ZX]' $f 2>/dev/null && echo x; done | wc -l)"; exit 3`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.Pids = 64; j.Limits.WallTimeMS = 30_000 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusFailed, 3)
				wantStdout(t, r, "started\nleft=0\n")
			},
		},
		{
			name: "fd-bomb", probe: true, argv: []string{probePath, "fdbomb"},
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.OpenFiles = 64 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				var b bomb
				decode(t, r, &b)
				if b.Errno != "EMFILE" || b.Count > 61 || b.Count < 50 {
					t.Fatalf("got %d descriptors then %q, want at most 61 then EMFILE (nofile 64)", b.Count, b.Errno)
				}
			},
		},
		{
			name: "log-flood-stderr", argv: sh(`head -c 20971520 /dev/zero >&2; echo done`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				if !r.Stderr.Truncated || r.Stderr.Bytes != 64<<10 || r.Stderr.Total != 20971520 {
					t.Errorf("got stderr %+v, want 65536 of 20971520 bytes kept", r.Stderr)
				}
				if !slices.Contains(r.LimitsHit, "log_bytes") {
					t.Errorf("got limits_hit %v, want log_bytes", r.LimitsHit)
				}
				wantStdout(t, r, "done\n")
			},
		},
		{
			name: "time-bomb-ignores-sigterm", argv: sh(`trap '' TERM INT HUP QUIT; while :; do :; done`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.WallTimeMS = 1500 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusTimedOut, 137)
				if r.Usage.WallTimeMS > 8000 {
					t.Errorf("got wall time %dms for a 1.5s limit", r.Usage.WallTimeMS)
				}
			},
		},
		{
			name: "time-bomb-background", argv: sh(`(trap '' TERM; exec sleep 600) & echo started; exit 0`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				wantStdout(t, r, "started\n")
				if d := r.EndedAt.Sub(r.StartedAt); d > 15*time.Second {
					t.Errorf("the job took %v: the background sleeper was waited for", d)
				}
			},
		},
		{
			name: "zombie-farm", probe: true, argv: []string{probePath, "zombies", "40"},
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.Pids = 64 },
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				var b bomb
				decode(t, r, &b)
				if b.Count != 40 || b.Errno != "" {
					t.Fatalf("got %d zombies (%q), want 40 left unreaped", b.Count, b.Errno)
				}
			},
		},

		// --- network: only interfaces and loopback inside the sandbox, and
		// a listener on the host's 127.0.0.1 ---
		{
			name: "net-interfaces", argv: sh(`ls /sys/class/net | tr '\n' ,; echo; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				w := "lo,\nlo,"
				if onRunsc() {
					w = "\nlo," // gVisor's sysfs has no /sys/class/net; its netstack shows lo in /proc/net/dev
				}
				if got := env.Stdout(t, r); got != w {
					t.Fatalf("got interfaces %q, want only lo (%q)", got, w)
				}
			},
		},
		// host-loopback-listener and dns are in TestHostLoopbackListener
		// and TestNameResolution: they need a listener per run.

		// --- raw and vsock sockets ---
		socketCase("raw", "AF_INET/raw", "AF_INET6/raw", "AF_PACKET/raw"),
		socketCase("vsock", "AF_VSOCK"),
		socketCase("af-alg", "AF_ALG"),

		// --- namespace escapes, ptrace, kernel attack surface ---
		syscallCase("unshare", "EPERM"),
		syscallCase("setns", "EPERM"),
		syscallCase("clone3", "ENOSYS"),
		syscallCase("mount", "EPERM"),
		syscallCase("open_tree", "EPERM"),
		syscallCase("ptrace", "EPERM"),
		syscallCase("io_uring_setup", "EPERM"),
		syscallCase("bpf", "EPERM"),
		syscallCase("userfaultfd", "EPERM"),
		syscallCase("perf_event_open", "EPERM"),
		syscallCase("keyctl", "EPERM"),
		syscallCase("open_by_handle_at", "EPERM"),
		syscallCase("name_to_handle_at", "EPERM"),
		{
			// The i386 ABI (int $0x80 from an amd64 process): another
			// syscall table the profile does not name. On runc the filter
			// kills the calling thread; gVisor has no such ABI at all.
			name: "abi-i386", probe: true, argv: []string{probePath, "abi"},
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				var got probe.ABIAttempt
				decode(t, r, &got)
				if probe.ForeignABI == "" {
					t.Skipf("no foreign ABI to try on this architecture: %+v", got)
				}
				if got.ABI != "i386" || !got.Refused() {
					t.Fatalf("got %+v, want getpid through the i386 ABI refused", got)
				}
				if strings.HasPrefix(got.Outcome, "fault: ") {
					t.Skipf("this kernel has no i386 ABI (%s): the profile's own refusal cannot be seen here", got.Outcome)
				}
				if !onRunsc() && got.Outcome != "killed" {
					t.Fatalf("got %+v, want the calling thread killed by the filter", got)
				}
			},
		},
		{
			// Device nodes on the scratch space (its nodev is ignored by
			// gVisor): no process of the sandbox may make one.
			name: "mknod-on-scratch", argv: sh(`for d in /work /tmp; do mknod $d/null c 1 3 2>&1; mkfifo $d/fifo && echo "fifo=$d"; done; ls -l /work /tmp | grep -c '^c'`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusFailed, 1) // grep -c finds no device node
				if got, w := env.Stdout(t, r), "mknod: /work/null: Operation not permitted\nfifo=/work\nmknod: /tmp/null: Operation not permitted\nfifo=/tmp\n0\n"; got != w {
					t.Fatalf("got %q, want %q", got, w)
				}
			},
		},
		{
			name: "unshare-user-namespace-shell", argv: sh(`unshare -r id 2>&1; echo "rc=$?"`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				wantStdout(t, r, "Operation not permitted", "rc=1\n")
			},
		},

		// --- /proc leaks and writes ---
		{
			name: "proc-leaks", argv: sh(`
				for f in /proc/keys /proc/timer_list /proc/kcore /proc/sched_debug; do echo "$f=$(cat $f 2>/dev/null | wc -c)"; done
				for p in /proc/[0-9]*; do [ "$(stat -c %u $p)" = 0 ] && { cat $p/environ >/dev/null 2>&1 && echo "environ-readable=$p"; cat $p/maps >/dev/null 2>&1 && echo "maps-readable=$p"; }; done
				echo "acpi=$(ls /proc/acpi | wc -l) firmware=$(ls /sys/firmware | wc -l)"`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				want := "/proc/keys=0\n/proc/timer_list=0\n/proc/kcore=0\n/proc/sched_debug=0\nacpi=0 firmware=0\n"
				if got := env.Stdout(t, r); got != want {
					t.Fatalf("got\n%s\nwant\n%s", got, want)
				}
			},
		},
		procAndCgroupWrites(),

		// --- environment and host fingerprinting ---
		{
			name: "environment-secrets", argv: []string{"/bin/env"},
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				got := strings.Split(strings.TrimSpace(env.Stdout(t, r)), "\n")
				slices.Sort(got)
				if w := []string{"HOME=/work", "HOSTNAME=sandbox", "PATH=/bin"}; !slices.Equal(got, w) {
					t.Fatalf("got environment %q, want exactly HOME, HOSTNAME and PATH (the host's secret must not appear)", got)
				}
			},
		},
		{
			name: "host-fingerprint", probe: true, argv: []string{probePath, "report"},
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				var rep probe.Report
				decode(t, r, &rep)
				props := selfcheck.Properties(rep, selfcheck.Expect{CandidateUID: 65534, CandidateGID: 65534,
					Env: map[string]string{"HOME": "/work", "HOSTNAME": "sandbox"}, Hostname: "sandbox",
					Volumes: []string{broker.ShimDir, "/inputs/probe"}, Runtime: env.Runtime})
				for _, p := range props {
					switch p.Name {
					case "mounts", "cgroup-namespace", "resolv-conf", "hostname", "environment", "file-descriptors":
						if !p.OK {
							t.Errorf("%s: %s", p.Name, p.Detail)
						}
					}
				}
			},
		},

		// --- hostile output trees ---
		{
			name: "output-symlinks-to-host-files", argv: sh(`mkdir -p /work/out && cd /work/out &&
				ln -s /etc/shadow shadow && ln -s /proc/1/environ environ && ln -s /.sandboxd/shim shim && ln -s / root`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				wantNoArtifacts(t, r)
				wantRejected(t, r, map[string]string{"/work/out/shadow": "symbolic link", "/work/out/environ": "symbolic link",
					"/work/out/shim": "symbolic link", "/work/out/root": "symbolic link"})
			},
		},
		{
			name: "output-dotdot-entries", argv: sh(`mkdir -p /work/out/a && cd /work/out &&
				printf x > ...; printf y > '..x'; ln -s ../../.. a/up; ln -s .. a/parent; printf z > a/'..'\\'..'; echo ok`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				var got []string
				for _, a := range r.Artifacts {
					got = append(got, a.Path)
				}
				if w := []string{"/work/out/...", "/work/out/..x", `/work/out/a/..\..`}; !slices.Equal(got, w) {
					t.Errorf("got artifacts %q, want %q", got, w)
				}
				wantRejected(t, r, map[string]string{"/work/out/a/up": "symbolic link", "/work/out/a/parent": "symbolic link"})
			},
		},
		{
			name: "output-fifo", argv: sh(`mkdir -p /work/out && mkfifo /work/out/pipe && mkfifo /work/out/held && (exec 3<>/work/out/held; sleep 600) & sleep 0.2; printf r > /work/out/real`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				wantRejected(t, r, map[string]string{"/work/out/pipe": "FIFO", "/work/out/held": "FIFO"})
				if len(r.Artifacts) != 1 || r.Artifacts[0].Path != "/work/out/real" {
					t.Errorf("got artifacts %+v, want only /work/out/real", r.Artifacts)
				}
			},
		},
		{
			name: "output-million-files", probe: true, argv: []string{probePath, "files", strconv.Itoa(manyFiles), "/work/out"},
			mod: func(t *testing.T, j *sandbox.Job) {
				j.Limits.MemoryBytes = 1 << 30
				j.Limits.FileCount = 100
				j.Limits.WallTimeMS = 120_000
			},
			check: func(t *testing.T, r sandbox.Result) {
				wantLimit(t, r, "file_count", 0)
				var b bomb
				decode(t, r, &b)
				if b.Count != manyFiles {
					t.Errorf("got %d files created (%q), want %d", b.Count, b.Errno, manyFiles)
				}
				if len(r.Artifacts) != 100 {
					t.Errorf("got %d artifacts, want the cap of 100", len(r.Artifacts))
				}
			},
		},
		{
			name: "output-sparse-10g", argv: sh(`mkdir -p /work/out && truncate -s 10G /work/out/sparse && printf r > /work/out/real; ls -l /work/out/sparse | awk '{print $5}'`),
			mod: func(t *testing.T, j *sandbox.Job) { j.Limits.FileSize = 16 << 30 },
			check: func(t *testing.T, r sandbox.Result) {
				wantLimit(t, r, "output_bytes", 0)
				wantStdout(t, r, "10737418240\n")
				if _, ok := r.Artifact("/work/out/sparse"); ok {
					t.Error("a 10 GB sparse file was collected under an 8 MiB output limit")
				}
			},
		},

		// --- inputs ---
		{
			name: "input-setuid-root-binary", argv: []string{"/inputs/suid/busybox", "sh", "-c", `id -u; stat -c '%a %u' /inputs/suid/busybox`},
			mod: func(t *testing.T, j *sandbox.Job) {
				bb, err := os.ReadFile("/bin/busybox")
				if err != nil {
					t.Fatal(err)
				}
				d := tarOf(t, tarEntry{tar.Header{Name: "busybox", Mode: 0o4755, Uid: 0, Gid: 0}, bb})
				j.Inputs = append(j.Inputs, sandbox.Input{Name: "suid", Digest: d, Path: "/inputs/suid"})
			},
			check: func(t *testing.T, r sandbox.Result) {
				// A set-user-ID, root-owned entry is not in the canonical
				// tar form: the input is refused and nothing runs. (Were it
				// to run, no_new_privs makes the bit grant nothing; the
				// self-check proves NoNewPrivs.)
				want(t, r, sandbox.StatusError, 0)
				if !strings.Contains(r.Cause, "not in canonical form") || r.Stdout.Total != 0 {
					t.Fatalf("got cause %q stdout %d bytes, want the input refused as non-canonical before anything ran", r.Cause, r.Stdout.Total)
				}
			},
		},
		{
			name: "input-setuid-writable-copy", argv: sh(`stat -c '%a %u' /work/tool`),
			mod: func(t *testing.T, j *sandbox.Job) {
				d := tarOf(t, tarEntry{tar.Header{Name: "tool", Mode: 0o6755, Uid: 0, Gid: 0}, []byte("#!/bin/sh\nid -u\n")})
				j.Inputs = append(j.Inputs, sandbox.Input{Name: "ws", Digest: d, Path: "/work", Writable: true})
			},
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusError, 0)
				if !strings.Contains(r.Cause, "not in canonical form") || r.Stdout.Total != 0 {
					t.Fatalf("got cause %q stdout %d bytes, want the input refused as non-canonical before anything ran", r.Cause, r.Stdout.Total)
				}
			},
		},

		// --- the result channel ---
		{
			name: "write-result-channel-via-proc-fd", argv: sh(`
				mkdir -p /work/out; printf real > /work/out/report.json
				for p in /proc/[0-9]*; do [ "$(stat -c %u $p)" = 0 ] || continue
					for fd in 0 1 2; do printf 'c\0\0\0\x10{"argv":["x"]}' > $p/fd/$fd 2>/dev/null && echo "wrote $p/fd/$fd"; done
					kill -9 ${p#/proc/} 2>/dev/null && echo "killed $p"
				done; echo end`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				if got := env.Stdout(t, r); got != "end\n" {
					t.Fatalf("got %q, want every write to a root process's stdio and every kill refused", got)
				}
				if a, ok := r.Artifact("/work/out/report.json"); !ok || a.Digest != sandbox.DigestBytes([]byte("real")) || len(r.Artifacts) != 1 {
					t.Errorf("got artifacts %+v, want exactly the report the candidate wrote", r.Artifacts)
				}
			},
		},

		// --- result forgery at the broker ---
		{
			name: "forge-report-outside-outputs", argv: sh(`
				mkdir -p /work/out /tmp/out; echo '{"passed":true}' > /work/report.json; echo '{"passed":true}' > /tmp/out/report.json
				echo '{"passed":true}' > /tmp/report.json; printf real > /work/out/report.json; echo done`),
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				if len(r.Artifacts) != 1 || r.Artifacts[0].Path != "/work/out/report.json" || r.Artifacts[0].Digest != sandbox.DigestBytes([]byte("real")) {
					t.Fatalf("got artifacts %+v, want only /work/out/report.json", r.Artifacts)
				}
			},
		},
		{
			name: "forge-read-hidden-tests", argv: sh(`ls -A /bundle /inputs | tr '\n' ,; find / -xdev -name '*hidden*' 2>/dev/null; echo end`),
			check: func(t *testing.T, r sandbox.Result) {
				// A candidate job gets no bundle: nothing to read.
				want(t, r, sandbox.StatusSucceeded, 0)
				if got := env.Stdout(t, r); got != "/bundle:,,/inputs:,end\n" {
					t.Fatalf("got %q, want empty /bundle and /inputs", got)
				}
			},
		},
		{
			name: "forge-rewrite-bundle", argv: sh(`
				for f in /bundle/tests/hidden_test.go /bundle/grader.sh; do echo 'PASS' > $f 2>/dev/null && echo "wrote $f"; done
				rm -rf /bundle/tests 2>/dev/null; mv /bundle/grader.sh /work/ 2>/dev/null && echo moved
				touch /bundle/report.json 2>/dev/null && echo planted
				cat /bundle/grader.sh`),
			mod: func(t *testing.T, j *sandbox.Job) {
				d := env.PutTree(t, map[string]string{"tests/": "", "tests/hidden_test.go": "package x", "grader.sh*": "#!/bin/sh\nexit 1\n"})
				j.Inputs = append(j.Inputs, sandbox.Input{Name: "bundle", Digest: d, Path: sandbox.BundlePath})
			},
			check: func(t *testing.T, r sandbox.Result) {
				want(t, r, sandbox.StatusSucceeded, 0)
				if got := env.Stdout(t, r); got != "#!/bin/sh\nexit 1\n" {
					t.Fatalf("got %q, want every write refused and the grader unchanged", got)
				}
			},
		},
		{
			name: "forge-exit-0-mid-test", argv: sh(`mkdir -p /work/out; echo '=== RUN   TestAdd'; exit 0; echo '{}' > /work/out/report.json`),
			check: func(t *testing.T, r sandbox.Result) {
				// Exit 0 with no report: the result carries no report
				// artifact, so nothing can be read as a pass.
				want(t, r, sandbox.StatusSucceeded, 0)
				wantNoArtifacts(t, r)
			},
		},
		{
			name: "forge-pass-lines", argv: sh(`printf -- '--- PASS: TestAdd (0.00s)\nPASS\nok  \texample\t0.001s\n{"Action":"pass","Test":"TestAdd"}\n'; printf 'PASS\n' >&2; exit 0`),
			check: func(t *testing.T, r sandbox.Result) {
				// PASS lines exist only as a log digest; no artifact.
				want(t, r, sandbox.StatusSucceeded, 0)
				wantNoArtifacts(t, r)
				if r.Stdout.Digest == "" || r.Stdout.Bytes == 0 {
					t.Errorf("got stdout %+v, want the lines kept as evidence for people", r.Stdout)
				}
			},
		},
	}
}

// procAndCgroupWrites tries /proc/sys and the cgroup tree, then reads the
// limits back. On runsc the tree is gVisor's cgroup v2 (read-only), which
// does not carry the job's pids limit: there it is RLIMIT_NPROC (see the
// broker's pidsLimits), read back from /proc/self/limits.
func procAndCgroupWrites() hostile {
	files := "/sys/fs/cgroup/memory/release_agent /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max"
	escape := "/sys/fs/cgroup/memory/escape"
	limit, wantOut := "pids.max=$(cat /sys/fs/cgroup/pids/pids.max)", "hostname=sandbox pids.max=64\n"
	if onRunsc() {
		files = "/sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max /sys/fs/cgroup/cgroup.subtree_control"
		escape = "/sys/fs/cgroup/escape"
		limit, wantOut = "nproc=$(awk '/^Max processes/{print $3 $4}' /proc/self/limits) cgroup=$(cat /proc/self/cgroup)", "hostname=sandbox nproc=6464 cgroup=0::/\n"
	}
	return hostile{
		name: "proc-and-cgroup-writes", argv: sh(`
			for f in /proc/sys/kernel/hostname /proc/sys/kernel/core_pattern /proc/sys/vm/drop_caches /proc/sysrq-trigger ` + files + `; do
				if echo 1 > $f; then echo "wrote $f"; fi
			done 2>/dev/null
			mkdir ` + escape + ` 2>/dev/null && echo "made cgroup"
			echo "hostname=$(hostname) ` + limit + `"`),
		check: func(t *testing.T, r sandbox.Result) {
			want(t, r, sandbox.StatusSucceeded, 0)
			if got := env.Stdout(t, r); got != wantOut {
				t.Fatalf("got %q, want no write to succeed and the limits unchanged (%q)", got, wantOut)
			}
		},
	}
}

func wantRejected(t *testing.T, r sandbox.Result, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, x := range r.Rejected {
		got[x.Path] = x.Reason
	}
	for p, reason := range want {
		if !strings.Contains(got[p], reason) {
			t.Errorf("rejected[%s] = %q, want %q", p, got[p], reason)
		}
	}
}

func TestHostile(t *testing.T) {
	os.Setenv("SANDBOXD_HOSTILE_SECRET", "must-not-leak") // in the broker's process: never in a sandbox
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := env.NewJob(t, tc.argv, func(j *sandbox.Job) {
				if tc.probe {
					withProbe(t)(j)
				}
				if tc.mod != nil {
					tc.mod(t, j)
				}
			})
			tc.check(t, env.Run(t, nil, j))
		})
	}
}

func TestHostLoopbackListener(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan string, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c.RemoteAddr().String()
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	j := env.NewJob(t, []string{probePath, "report", "-connect", fmt.Sprintf("127.0.0.1:%d", port)}, withProbe(t))
	r := env.Run(t, nil, j)
	want(t, r, sandbox.StatusSucceeded, 0)
	var rep probe.Report
	decode(t, r, &rep)
	if rep.Connect == nil || rep.Connect.OK || !strings.Contains(rep.Connect.Error, "connection refused") {
		t.Errorf("got connect %+v, want connection refused (the sandbox's own loopback)", rep.Connect)
	}
	select {
	case from := <-accepted:
		t.Errorf("the host loopback listener accepted %s", from)
	default:
	}
}

func TestNameResolution(t *testing.T) {
	t.Parallel()
	// The only resolver is 127.0.0.1 inside the sandbox: the query never
	// leaves the sandbox's own loopback.
	j := env.NewJob(t, []string{probePath, "report", "-resolve", "sandboxd-hostile.invalid"}, withProbe(t))
	r := env.Run(t, nil, j)
	want(t, r, sandbox.StatusSucceeded, 0)
	var rep probe.Report
	decode(t, r, &rep)
	if rep.Resolve == nil || rep.Resolve.OK || !strings.Contains(rep.Resolve.Error, "127.0.0.1:53") {
		t.Errorf("got resolve %+v, want a failure against 127.0.0.1:53", rep.Resolve)
	}
	if rep.ResolvConf != "nameserver 127.0.0.1\n" {
		t.Errorf("got resolv.conf %q, want only nameserver 127.0.0.1", rep.ResolvConf)
	}
}

// TestCraftedWorkdir covers CVE-2024-21626 ("Leaky Vessels"): a working
// directory through a leaked descriptor. Such a workdir never reaches the
// engine, and the candidate inherits no descriptor beyond stdio.
func TestCraftedWorkdir(t *testing.T) {
	t.Parallel()
	for _, wd := range []string{"/proc/self/fd/7", "/proc/1/cwd", "/work/../proc/self/fd/8", "/sys/fs/cgroup", "/"} {
		j := env.NewJob(t, sh("true"), nil)
		j.WorkDir, j.Digest = wd, ""
		var fe *sandbox.FieldError
		if err := j.Seal(); !errors.As(err, &fe) || fe.Field != "job.workdir" {
			t.Errorf("workdir %q: got %v, want a FieldError on job.workdir", wd, err)
		}
	}
	r := env.Run(t, nil, env.NewJob(t, []string{probePath, "report"}, withProbe(t)))
	want(t, r, sandbox.StatusSucceeded, 0)
	var rep probe.Report
	decode(t, r, &rep)
	for fd, target := range rep.FDs {
		switch {
		case fd == "0" && target == "/dev/null", (fd == "1" || fd == "2") && strings.HasPrefix(target, "pipe:["):
		case strings.HasPrefix(target, "/sys/fs/cgroup/cpu/cpu.cfs_"), target == "/sys/fs/cgroup/cpu.max": // the Go runtime's own (cgroup v1, v2), opened after exec
		default:
			t.Errorf("descriptor %s -> %s was inherited", fd, target)
		}
	}
	if len(rep.FDs) < 3 {
		t.Errorf("got descriptors %v, want at least stdio", rep.FDs)
	}
}

// TestInputTarSlip gives a job inputs whose tar entries escape their
// directory. Nothing may land outside, and the command must not run.
func TestInputTarSlip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		writable bool
		entry    tar.Header
		cause    string
	}{
		{"writable dotdot", true, tar.Header{Name: "../../etc/evil", Mode: 0o644}, "path escapes the tree"},
		{"writable absolute", true, tar.Header{Name: "/etc/evil", Mode: 0o644}, "absolute path"},
		{"writable symlink", true, tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, "unsupported symlink"},
		{"read-only dotdot", false, tar.Header{Name: "../../../evil", Mode: 0o644}, "path escapes the tree"},
		{"read-only symlink out", false, tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}, "unsupported symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := tarOf(t, tarEntry{tc.entry, []byte("evil")})
			path := "/inputs/slip"
			if tc.writable {
				path = "/work/slip"
			}
			j := env.NewJob(t, sh(`echo ran; ls -la `+path+`; cat /etc/evil /evil 2>&1`), func(j *sandbox.Job) {
				j.Inputs = []sandbox.Input{{Name: "slip", Digest: d, Path: path, Writable: tc.writable}}
			})
			r, err := env.Broker.Run(t.Context(), j)
			env.AssertGone(t, j)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if r.Status != sandbox.StatusError || !strings.Contains(r.Cause, tc.cause) || r.Stdout.Total != 0 {
				t.Fatalf("got status %s cause %q stdout %d bytes, want error naming %q before anything ran", r.Status, r.Cause, r.Stdout.Total, tc.cause)
			}
		})
	}
}
