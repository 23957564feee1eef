package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

func TestExitZeroCollectsArtifacts(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh(`mkdir -p /work/out/sub && printf 'hello' > /work/out/a.txt && printf '{"x":1}' > /work/out/sub/r.json && echo done`), nil)
	res := runJob(t, j)
	if res.Status != sandbox.StatusSucceeded || res.ExitCode != 0 {
		t.Fatalf("status %s exit %d (%s), want succeeded 0", res.Status, res.ExitCode, res.Cause)
	}
	want := map[string]string{
		"/work/out/a.txt":      sandbox.DigestBytes([]byte("hello")),
		"/work/out/sub/r.json": sandbox.DigestBytes([]byte(`{"x":1}`)),
	}
	if len(res.Artifacts) != len(want) {
		t.Fatalf("got %d artifacts %+v, want %d", len(res.Artifacts), res.Artifacts, len(want))
	}
	for _, a := range res.Artifacts {
		if want[a.Path] != a.Digest {
			t.Errorf("artifact %s digest %s, want %s", a.Path, a.Digest, want[a.Path])
		}
		if got := sandbox.DigestBytes(readBlob(t, a.Digest)); got != a.Digest {
			t.Errorf("stored blob of %s hashes to %s", a.Path, got)
		}
	}
	if got := stdout(t, res); got != "done\n" {
		t.Errorf("stdout %q, want %q", got, "done\n")
	}
	if res.JobDigest != j.Digest || res.Security.SeccompDigest == "" || res.Runtime.EngineVersion == "" {
		t.Errorf("result not bound to its job/runtime: %+v", res)
	}
}

func TestExitThreeFails(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh("exit 3"), nil))
	if res.Status != sandbox.StatusFailed || res.ExitCode != 3 {
		t.Fatalf("status %s exit %d, want failed 3", res.Status, res.ExitCode)
	}
}

func TestMissingCommandIs127(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, []string{"/no/such/binary"}, nil))
	if res.Status != sandbox.StatusFailed || res.ExitCode != 127 {
		t.Fatalf("status %s exit %d, want failed 127", res.Status, res.ExitCode)
	}
	if !strings.Contains(stderr(t, res), "/no/such/binary") {
		t.Errorf("stderr %q does not name the missing command", stderr(t, res))
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh("trap '' TERM; sleep 60"), func(j *sandbox.Job) { j.Limits.WallTimeMS = 1500 })
	start := time.Now()
	res := runJob(t, j)
	took := time.Since(start)
	if res.Status != sandbox.StatusTimedOut {
		t.Fatalf("status %s (%s), want timed_out", res.Status, res.Cause)
	}
	if took > 1500*time.Millisecond+30*time.Second {
		t.Errorf("took %v for a 1.5s deadline", took)
	}
}

func TestMemoryBomb(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, script string }{
		{"direct", `x=aaaaaaaaaaaaaaaa; while true; do x="$x$x"; done`},
		{"shell exits 0", `(x=aaaaaaaaaaaaaaaa; while true; do x="$x$x"; done); exit 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runJob(t, newJob(t, sh(tc.script), func(j *sandbox.Job) { j.Limits.MemoryBytes = 32 << 20 }))
			if res.Status != sandbox.StatusOOMKilled {
				t.Fatalf("status %s exit %d (%s), want oom_killed", res.Status, res.ExitCode, res.Cause)
			}
		})
	}
}

func TestForkBombContained(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh(`b(){ b | b & }; b; sleep 3; echo survived`), func(j *sandbox.Job) {
		j.Limits.Pids = 32
		j.Limits.WallTimeMS = 10_000
	})
	res := runJob(t, j)
	if res.Status == sandbox.StatusError || res.Status == sandbox.StatusUncertain {
		t.Fatalf("status %s (%s): the bomb was not contained", res.Status, res.Cause)
	}
	// The host stays responsive: a trivial job right after runs normally.
	after := runJob(t, newJob(t, sh("echo ok"), nil))
	if after.Status != sandbox.StatusSucceeded {
		t.Fatalf("job after the fork bomb: %s (%s)", after.Status, after.Cause)
	}
}

func TestReadOnlyRootAndBundle(t *testing.T) {
	t.Parallel()
	bundle := putTree(t, map[string]string{"tests/": "", "tests/hidden_test.go": "package x // hidden", "grader.sh": "#!/bin/sh\n"})
	j := newJob(t, sh(`
		cat /bundle/tests/hidden_test.go >/dev/null || exit 10
		echo x > /bundle/tests/hidden_test.go 2>/dev/null && exit 11
		rm -f /bundle/grader.sh 2>/dev/null; [ -e /bundle/grader.sh ] || exit 12
		echo x > /etc/passwd 2>/dev/null && exit 13
		touch /newfile 2>/dev/null && exit 14
		touch /.sandboxd/x 2>/dev/null && exit 15
		echo x > /.sandboxd/shim 2>/dev/null && exit 16
		touch /work/ok && touch /tmp/ok || exit 17
		exit 0`), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
	})
	res := runJob(t, j)
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("status %s exit %d (%s): a write that must fail succeeded or a read failed", res.Status, res.ExitCode, stderr(t, res))
	}
	if err := env.Blobs.Verify(bundle); err != nil {
		t.Fatalf("broker's copy of the bundle changed: %v", err)
	}
	// The cached volume is reused, unchanged, by the next job.
	res2 := runJob(t, newJob(t, sh(`cat /bundle/tests/hidden_test.go`), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
	}))
	if got := stdout(t, res2); got != "package x // hidden" {
		t.Fatalf("second job read %q", got)
	}
}

func TestWritableInputIsAPrivateCopy(t *testing.T) {
	t.Parallel()
	ws := putTree(t, map[string]string{"src/": "", "src/main.go": "package main", "run.sh": "echo hi"})
	j := newJob(t, sh(`cat /work/src/main.go && echo changed > /work/src/main.go && cat /work/src/main.go && ls -l /work/run.sh`), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "workspace", Digest: ws, Path: sandbox.WorkPath, Writable: true}}
	})
	res := runJob(t, j)
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("status %s (%s) stderr %q", res.Status, res.Cause, stderr(t, res))
	}
	out := stdout(t, res)
	if !strings.HasPrefix(out, "package mainchanged\n") || !strings.Contains(out, "sandbox") {
		t.Errorf("stdout %q: want the staged file, the change, and candidate ownership", out)
	}
	if err := env.Blobs.Verify(ws); err != nil {
		t.Fatalf("workspace blob changed: %v", err)
	}
}

func TestScratchSpaceIsBounded(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh(`dd if=/dev/zero of=/work/fill bs=1M count=200 2>/dev/null; echo rc=$?`), func(j *sandbox.Job) {
		j.Limits.DiskBytes = 8 << 20
	})
	res := runJob(t, j)
	if res.Status != sandbox.StatusLimitExceeded || res.Limit != "disk_bytes" {
		t.Fatalf("status %s limit %q (%s), want limit_exceeded disk_bytes", res.Status, res.Limit, res.Cause)
	}
	if res.Usage.WorkBytesUsed > 8<<20 {
		t.Errorf("work used %d bytes, over its 8 MiB bound", res.Usage.WorkBytesUsed)
	}
}

func TestLogFloodTruncated(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh(`head -c 52428800 /dev/zero; echo end >&2`), nil))
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("status %s (%s), want succeeded (log truncation is flagged, not a failure)", res.Status, res.Cause)
	}
	if !res.Stdout.Truncated || res.Stdout.Bytes != 64<<10 || res.Stdout.Total != 52428800 {
		t.Fatalf("stdout %+v, want truncated at 65536 of 52428800", res.Stdout)
	}
	if !slices.Contains(res.LimitsHit, "log_bytes") {
		t.Errorf("limits_hit %v lacks log_bytes", res.LimitsHit)
	}
	if stderr(t, res) != "end\n" {
		t.Errorf("stderr %q", stderr(t, res))
	}
}

func TestHostileOutputs(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh(`
		mkdir -p /work/out/many /work/out/d
		ln -s /etc/shadow /work/out/shadow
		ln -s ../../ /work/out/up
		ln -s /work/out/d /work/out/dirlink
		mkfifo /work/out/fifo
		printf secret > /work/out/locked && chmod 000 /work/out/locked
		cd /work/out/many && seq 1 100000 | xargs touch
		echo ok`), func(j *sandbox.Job) {
		j.Limits.FileCount = 50
		j.Limits.WallTimeMS = 60_000
	})
	res := runJob(t, j)
	if res.Status != sandbox.StatusLimitExceeded || res.Limit != "file_count" {
		t.Fatalf("status %s limit %q (%s), want limit_exceeded file_count", res.Status, res.Limit, res.Cause)
	}
	if len(res.Artifacts) != 50 {
		t.Errorf("%d artifacts, want the cap of 50", len(res.Artifacts))
	}
	reasons := map[string]string{}
	for _, r := range res.Rejected {
		reasons[r.Path] = r.Reason
	}
	for p, want := range map[string]string{
		"/work/out/shadow":  "symbolic link",
		"/work/out/up":      "symbolic link",
		"/work/out/dirlink": "symbolic link",
		"/work/out/fifo":    "FIFO",
	} {
		if !strings.Contains(reasons[p], want) {
			t.Errorf("rejected[%s] = %q, want %q", p, reasons[p], want)
		}
	}
	if a, ok := res.Artifact("/work/out/locked"); !ok || a.Digest != sandbox.DigestBytes([]byte("secret")) {
		t.Errorf("a file the candidate made unreadable to itself was not collected: %+v", a)
	}
	for _, a := range res.Artifacts {
		if !strings.HasPrefix(a.Path, "/work/out/") {
			t.Errorf("artifact outside the output directory: %s", a.Path)
		}
	}
	if len(res.Rejected) > 1024 {
		t.Errorf("%d rejected entries: the list is not bounded", len(res.Rejected))
	}
}

func TestNetworkIsolation(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`
		echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ',')"
		if nc -w 2 127.0.0.1 %d </dev/null; then echo host-listener=reached; else echo host-listener=unreachable; fi
		if nslookup sandboxd.invalid >/dev/null 2>&1; then echo dns=resolved; else echo dns=failed; fi
		echo "resolv=$(grep nameserver /etc/resolv.conf | tr '\n' ',')"`, port)
	res := runJob(t, newJob(t, sh(script), nil))
	out := stdout(t, res)
	for _, want := range []string{"ifaces=lo,\n", "host-listener=unreachable", "dns=failed", "resolv=nameserver 127.0.0.1,"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	select {
	case <-accepted:
		t.Error("the host loopback listener accepted a connection from the sandbox")
	default:
	}
}

func TestEnvironmentIsExactly(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, []string{"/bin/env"}, func(j *sandbox.Job) {
		j.Env = map[string]string{"GOFLAGS": "-count=1", "EMPTY": ""}
	}))
	got := strings.Split(strings.TrimSpace(stdout(t, res)), "\n")
	slices.Sort(got)
	want := []string{"EMPTY=", "GOFLAGS=-count=1", "HOME=/work", "HOSTNAME=sandbox", "PATH=/bin"}
	if !slices.Equal(got, want) {
		t.Fatalf("environment %q, want %q", got, want)
	}
}

// A job's argv and environment may together be larger than one string
// the kernel passes at exec (MAX_ARG_STRLEN, 128 KiB): the helper's
// children once took the job's config as one, and such a job ended error
// at staging ("argument list too long"). It has an output, so that the
// collector (a child too) runs.
func TestLargeEnvironmentRuns(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh(`mkdir -p /work/out && printf %s "$PAD_7" | wc -c > /work/out/n && env | grep -c ^PAD_`), func(j *sandbox.Job) {
		for i := range 12 {
			j.Env[fmt.Sprintf("PAD_%d", i)] = strings.Repeat("x", 30<<10)
		}
	}))
	if res.Status != sandbox.StatusSucceeded || res.ExitCode != 0 {
		t.Fatalf("status %s exit %d (%s), want succeeded 0", res.Status, res.ExitCode, res.Cause)
	}
	if got := stdout(t, res); got != "12\n" {
		t.Errorf("stdout %q, want 12 PAD_ variables", got)
	}
	if len(res.Artifacts) != 1 || strings.TrimSpace(string(readBlob(t, res.Artifacts[0].Digest))) != fmt.Sprint(30<<10) {
		t.Errorf("artifacts %+v, want /work/out/n holding %d", res.Artifacts, 30<<10)
	}
}

func TestCandidateHasNoPrivileges(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh(`
		grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t' ' '
		cat /proc/1/environ >/dev/null 2>&1 && echo environ=readable || echo environ=denied
		for p in /proc/[0-9]*; do [ "$(stat -c %u $p)" = 0 ] && { echo x > $p/fd/1 2>/dev/null && echo "wrote=$p"; kill -9 ${p#/proc/} 2>/dev/null && echo "killed=$p"; }; done
		echo end`), nil))
	out := stdout(t, res)
	for _, want := range []string{"Uid: 65534 65534 65534 65534", "CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2", "environ=denied", "end"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "wrote=") || strings.Contains(out, "killed=") {
		t.Errorf("candidate reached a root process:\n%s", out)
	}
	if res.Status != sandbox.StatusSucceeded {
		t.Errorf("status %s (%s)", res.Status, res.Cause)
	}
}

func TestImageRefusedBeforeAnythingIsCreated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, image string }{
		{"tag", "busybox:latest"},
		{"unknown id", "sha256:" + strings.Repeat("ab", 32)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, sh("true"), nil)
			j.Image = tc.image
			j.Digest = ""
			if err := j.Seal(); err != nil {
				if !errors.Is(err, sandbox.ErrInvalid) {
					t.Fatalf("seal: %v", err)
				}
				return // refused at validation, before the broker
			}
			_, err := env.Broker.Run(context.Background(), j)
			if !errors.Is(err, sandbox.ErrImageRefused) {
				t.Fatalf("got %v, want ErrImageRefused", err)
			}
			assertGone(t, j)
		})
	}
	// A tag never reaches the broker: Validate refuses it and names the field.
	j := newJob(t, sh("true"), nil)
	j.Image = "busybox:latest"
	var fe *sandbox.FieldError
	if err := j.Validate(); !errors.As(err, &fe) || fe.Field != "job.image" {
		t.Fatalf("Validate with a tag: %v, want a FieldError on job.image", err)
	}
}

func TestCancellationCleansUp(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh("sleep 60"), nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(2*time.Second, cancel)
	res, err := env.Broker.Run(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusCancelled {
		t.Fatalf("status %s (%s), want cancelled", res.Status, res.Cause)
	}
	assertGone(t, j)
}

func TestSameJobTwiceConflictsWhileRunning(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh("sleep 3"), nil)
	done := make(chan sandbox.Result, 1)
	go func() {
		r, _ := env.Broker.Run(context.Background(), j)
		done <- r
	}()
	// Wait until its container exists, then run the same job again.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		cs, _ := env.Eng.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", broker.LabelJob+"="+j.ID)})
		if len(cs.Items) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := env.Broker.Run(context.Background(), j); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("second Run of a running job: %v, want ErrConflict", err)
	}
	if r := <-done; r.Status != sandbox.StatusSucceeded {
		t.Fatalf("first run: %s (%s)", r.Status, r.Cause)
	}
	assertGone(t, j)
}

// A restarted process runs a job dispatched with no container bound
// (Hooks.ReclaimName), and meets the create the killed process sent, landed
// after the restart freed the job's name: a container of the job, created,
// never started. It is removed and the job runs once. A container of the
// job that started is never taken: that run is refused.
func TestAReclaimedNameOnTheEngine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("a create that landed late", func(t *testing.T) {
		j := newJob(t, sh("echo ran"), nil)
		created, release, first := make(chan string, 1), make(chan struct{}), make(chan error, 1)
		go func() {
			// The killed process: its create landed; its binding never did.
			_, err := env.Broker.RunWithHooks(ctx, j, broker.Hooks{OnCreated: func(_ context.Context, id string) error {
				created <- id
				<-release
				return errors.New("killed before the binding was durable")
			}})
			first <- err
		}()
		end := sync.OnceFunc(func() { close(release); <-first }) // the first run ends, removing what it made
		t.Cleanup(end)
		var left string
		select {
		case left = <-created:
		case <-time.After(time.Minute):
			t.Fatal("the first create did not land within a minute")
		}
		res, err := env.Broker.RunWithHooks(ctx, j, broker.Hooks{ReclaimName: true})
		if err != nil || res.Status != sandbox.StatusSucceeded || !strings.Contains(stdout(t, res), "ran") {
			t.Fatalf("the run after the restart: %s (%s), %v; want it run", res.Status, res.Cause, err)
		}
		if _, err := env.Eng.ContainerInspect(ctx, left, client.ContainerInspectOptions{}); !errdefs.IsNotFound(err) {
			t.Errorf("the container the killed process left: %v, want removed", err)
		}
		end()
		assertGone(t, j)
	})
	t.Run("a container of the job that started", func(t *testing.T) {
		j := newJob(t, sh("sleep 3"), nil)
		done := make(chan sandbox.Result, 1)
		go func() {
			r, _ := env.Broker.Run(ctx, j)
			done <- r
		}()
		deadline := time.Now().Add(30 * time.Second)
		for {
			cs, _ := env.Eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", broker.LabelJob+"="+j.ID)})
			if len(cs.Items) > 0 && cs.Items[0].State == container.StateRunning {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the job's container did not start within 30 s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := env.Broker.RunWithHooks(ctx, j, broker.Hooks{ReclaimName: true}); !errors.Is(err, sandbox.ErrConflict) {
			t.Errorf("a second run, with ReclaimName, of a job running: %v, want ErrConflict", err)
		}
		if r := <-done; r.Status != sandbox.StatusSucceeded {
			t.Fatalf("the first run: %s (%s), want it undisturbed", r.Status, r.Cause)
		}
		assertGone(t, j)
	})
}

// lyingEngine reports an inspected container that differs from what the
// broker asked for, as a compromised or buggy engine might.
type lyingEngine struct {
	testharness.Engine
	tamper func(*client.ContainerInspectResult)
}

func (l lyingEngine) ContainerInspect(ctx context.Context, id string, o client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	r, err := l.Engine.ContainerInspect(ctx, id, o)
	if err == nil && r.Container.State != nil && r.Container.State.Status == "created" {
		l.tamper(&r)
	}
	return r, err
}

func TestInspectedSettingsMismatchIsAnError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		setting string
		tamper  func(*client.ContainerInspectResult)
	}{
		{"Privileged", func(r *client.ContainerInspectResult) { r.Container.HostConfig.Privileged = true }},
		{"CapAdd", func(r *client.ContainerInspectResult) {
			r.Container.HostConfig.CapAdd = append(r.Container.HostConfig.CapAdd, "CAP_SYS_ADMIN")
		}},
		{"NetworkMode", func(r *client.ContainerInspectResult) { r.Container.HostConfig.NetworkMode = "host" }},
		{"SecurityOpt", func(r *client.ContainerInspectResult) {
			r.Container.HostConfig.SecurityOpt = []string{"no-new-privileges:true"}
		}},
		{"MaskedPaths", func(r *client.ContainerInspectResult) { r.Container.HostConfig.MaskedPaths = nil }},
		{"ReadonlyRootfs", func(r *client.ContainerInspectResult) { r.Container.HostConfig.ReadonlyRootfs = false }},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			b, err := broker.New(lyingEngine{env.Eng, tc.tamper}, env.Blobs, env.Cfg)
			if err != nil {
				t.Fatal(err)
			}
			j := newJob(t, sh("echo must-not-run"), nil)
			res, err := b.Run(context.Background(), j)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusError || !strings.Contains(res.Cause, tc.setting) {
				t.Fatalf("status %s cause %q, want error naming %s", res.Status, res.Cause, tc.setting)
			}
			if res.Stdout.Total != 0 {
				t.Errorf("the job ran: stdout %d bytes", res.Stdout.Total)
			}
			assertGone(t, j)
		})
	}
}

func TestBundleCachedAndCheckedByDigest(t *testing.T) {
	// Not parallel: it reads the broker's counters.
	bundle := putTree(t, map[string]string{"tests/": "", "tests/a_test.go": "package a // cached " + t.Name()})
	withBundle := func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
	}
	before := env.Broker.Stats().VolumesPopulated.Load()
	for i := range 2 {
		res := runJob(t, newJob(t, sh("cat /bundle/tests/a_test.go"), withBundle))
		if res.Status != sandbox.StatusSucceeded {
			t.Fatalf("job %d: %s (%s)", i, res.Status, res.Cause)
		}
	}
	if got := env.Broker.Stats().VolumesPopulated.Load() - before; got != 1 {
		t.Fatalf("two jobs with one bundle populated %d volumes, want 1", got)
	}
}

// A blob that no longer holds its digest is never mounted read-only (no
// volume is made of it) and never run on writable: the helper may have
// extracted its bytes, but the broker's check over them fails and the
// helper never gets the go-ahead, so the command never starts.
func TestTamperedInputIsNeverMounted(t *testing.T) {
	t.Parallel()
	digest := putTree(t, map[string]string{"tests/": "", "tests/a_test.go": "package a // " + t.Name()})
	p, _ := env.Blobs.Path(digest)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	b[1030] ^= 1 // a byte of the file's content (after two 512-byte headers)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, writable := range []bool{false, true} {
		j := newJob(t, sh("echo must-not-run"), func(j *sandbox.Job) {
			path := sandbox.BundlePath
			if writable {
				path = sandbox.WorkPath
			}
			j.Inputs = []sandbox.Input{{Name: "bundle", Digest: digest, Path: path, Writable: writable}}
		})
		res := runJob(t, j)
		if res.Status != sandbox.StatusError || !strings.Contains(res.Cause, "digest") {
			t.Fatalf("writable=%v: status %s (%s), want error naming the digest", writable, res.Status, res.Cause)
		}
		if res.Stdout.Total != 0 {
			t.Fatalf("writable=%v: the job ran", writable)
		}
	}
	vs, err := env.Eng.VolumeList(context.Background(), client.VolumeListOptions{Filters: make(client.Filters).Add("label", broker.LabelDigest+"="+digest)})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs.Items) != 0 {
		t.Fatalf("a volume was created for the tampered blob: %v", vs.Items[0].Name)
	}
}

// A new process of the same broker trusts a volume another one checked (the
// record names the volume's creation and the checked tree), and checks
// again a volume that was created anew.
func TestCheckedVolumesAreRemembered(t *testing.T) {
	t.Parallel()
	cfg := env.Cfg
	cfg.CacheDir = t.TempDir()
	bundle := putTree(t, map[string]string{"tests/": "", "tests/r_test.go": "package r // " + t.Name()})
	job := func() sandbox.Job {
		return newJob(t, sh("cat /bundle/tests/r_test.go"), func(j *sandbox.Job) {
			j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
		})
	}
	newBroker := func() *broker.Broker {
		b, err := broker.New(env.Eng, env.Blobs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := newBroker()
	if r := env.Run(t, first, job()); r.Status != sandbox.StatusSucceeded {
		t.Fatalf("first: %s (%s)", r.Status, r.Cause)
	}
	second := newBroker()
	if r := env.Run(t, second, job()); r.Status != sandbox.StatusSucceeded {
		t.Fatalf("second: %s (%s)", r.Status, r.Cause)
	}
	if got := second.Stats().VolumesChecked.Load(); got != 0 {
		t.Fatalf("a new broker process read back %d volumes, want 0 (both were checked before)", got)
	}
	// The bundle's volume removed and created anew: checked again.
	vol := cfg.VolumePrefix + "-input-" + strings.TrimPrefix(bundle, "sha256:")
	if _, err := env.Eng.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	third := newBroker()
	if r := env.Run(t, third, job()); r.Status != sandbox.StatusSucceeded || stdout(t, r) != "package r // "+t.Name() {
		t.Fatalf("third: %s (%s)", r.Status, r.Cause)
	}
	if got := third.Stats().VolumesChecked.Load(); got == 0 {
		t.Fatal("a volume created anew was trusted without a check")
	}
	// The same process notices too: the volume it checked is gone.
	if _, err := env.Eng.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	before := third.Stats().VolumesChecked.Load()
	if r := env.Run(t, third, job()); r.Status != sandbox.StatusSucceeded || stdout(t, r) != "package r // "+t.Name() {
		t.Fatalf("third again: %s (%s)", r.Status, r.Cause)
	}
	if third.Stats().VolumesChecked.Load() == before {
		t.Fatal("a volume removed after its check was trusted by the process that checked it")
	}
}

// An output path whose middle component the candidate turned into a link
// is never followed: nothing outside the job's scratch space is collected.
func TestOutputPathThroughALinkIsRefused(t *testing.T) {
	t.Parallel()
	j := newJob(t, sh(`mkdir -p /tmp/elsewhere/out && echo outside > /tmp/elsewhere/out/f && rm -rf /work/res /work/root && ln -s /tmp/elsewhere /work/res && ln -s / /work/root && ls /work/res/out /work/root/etc >/dev/null`), func(j *sandbox.Job) {
		j.Outputs = []string{"/work/res/out", "/work/root/etc"}
	})
	res := runJob(t, j)
	if len(res.Artifacts) != 0 {
		t.Fatalf("collected through a link: %+v", res.Artifacts)
	}
	if len(res.Rejected) != 2 {
		t.Fatalf("rejected %+v, want both output directories", res.Rejected)
	}
	for _, r := range res.Rejected {
		if !strings.Contains(r.Reason, "output directory") {
			t.Errorf("rejected %s for %q", r.Path, r.Reason)
		}
	}
}

// What a command runs through the helper's exec service runs as the code
// uid: it cannot write the command's files, reach its descriptors through
// /proc or signal it, and its exit code comes back.
func TestExecServiceSeparatesTheCodeUID(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh(`
		mkdir -p /work/out && echo grader > /work/out/report
		echo "grader-pid=$$"
		/.sandboxd/shim exec /bin/sh -c '
			echo "code=$(id -u)"
			echo forged > /work/out/report 2>/dev/null && echo wrote-report
			for fd in /proc/[0-9]*/fd/1; do echo forged 2>/dev/null >> $fd && echo "wrote-$fd"; done
			kill -9 $PPID 2>/dev/null && echo killed-parent
			exit 7'
		echo "exec=$?"
		echo "report=$(cat /work/out/report)"`), nil))
	out := stdout(t, res)
	for _, want := range []string{"code=65533\n", "exec=7\n", "report=grader\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"wrote-report", "killed-parent"} {
		if strings.Contains(out, bad) {
			t.Errorf("the code uid could %s:\n%s", bad, out)
		}
	}
	// It may write only its own descriptors, never the command's.
	var graderPID string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "grader-pid="); ok {
			graderPID = v
		}
	}
	if graderPID == "" || strings.Contains(out, "wrote-/proc/"+graderPID+"/fd/1") {
		t.Errorf("the code uid wrote the command's stdout (grader pid %q):\n%s", graderPID, out)
	}
	if res.Security.CodeUID != 65533 {
		t.Errorf("result records code uid %d, want 65533", res.Security.CodeUID)
	}
	if a, ok := res.Artifact("/work/out/report"); !ok || a.Digest != sandbox.DigestBytes([]byte("grader\n")) {
		t.Errorf("report artifact %+v, want the command's own", a)
	}
}

// Processes the exec service started are killed with the command's: a
// code-uid process left behind neither outlives the job nor keeps it open.
func TestExecServiceLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	start := time.Now()
	res := runJob(t, newJob(t, sh(`/.sandboxd/shim exec /bin/sh -c 'sleep 1000 & echo started'; echo done`), nil))
	if res.Status != sandbox.StatusSucceeded || !strings.Contains(stdout(t, res), "started\ndone\n") {
		t.Fatalf("status %s (%s), stdout %q", res.Status, res.Cause, stdout(t, res))
	}
	if took := time.Since(start); took > 60*time.Second {
		t.Fatalf("the job waited %v for a code-uid process", took)
	}
}

// A program that detaches from its session (setsid) keeping the caller's
// pipe does not outlive its call: the end of the last call in flight kills
// every code-uid process, so a grader reading the program's output through
// a pipe gets its end. It held the pipe, and the grader, until wall time.
// A detached process cannot keep itself alive by making a call of its own
// (it is not in that call's session).
func TestExecServiceCallLeavesNoDetachedProcess(t *testing.T) {
	t.Parallel()
	for name, detached := range map[string]string{
		"sleeps":            `echo detached; sleep 1000`,
		"calls the service": `echo detached; /.sandboxd/shim exec /bin/sleep 1000`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res := runJob(t, newJob(t, sh(`
				/.sandboxd/shim exec /bin/sh -c 'setsid /bin/sh -c "`+detached+`" & sleep 0.5; echo started' | cat
				echo "left=$(for f in /proc/[0-9]*/status; do grep -q '^Uid:[[:space:]]*65533[[:space:]]' $f 2>/dev/null && ! grep -q '^State:[[:space:]]*[ZX]' $f 2>/dev/null && echo x; done | wc -l)"`), func(j *sandbox.Job) {
				j.Limits.WallTimeMS = 15_000
			}))
			if res.Status != sandbox.StatusSucceeded {
				t.Fatalf("status %s (%s), want succeeded: the grader waited on a detached program's pipe", res.Status, res.Cause)
			}
			out := stdout(t, res)
			for _, want := range []string{"detached\n", "started\n", "left=0\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// A read-only input is readable by the command's uid and not by the code
// uid: a program graded out of process never sees the hidden tests.
func TestCodeUIDCannotReadTheBundle(t *testing.T) {
	t.Parallel()
	bundle := putTree(t, map[string]string{"answers": "42 " + t.Name()})
	res := runJob(t, newJob(t, sh(`
		cat /bundle/answers >/dev/null && echo grader-reads
		/.sandboxd/shim exec /bin/cat /bundle/answers >/dev/null 2>&1 && echo code-reads
		/.sandboxd/shim exec /bin/ls /bundle >/dev/null 2>&1 && echo code-lists
		echo end`), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
	}))
	if got := stdout(t, res); got != "grader-reads\nend\n" {
		t.Fatalf("stdout %q, want only the grader to read the bundle", got)
	}
}

// The result names the engine and the runtime that ran the job.
func TestResultNamesEngineAndRuntime(t *testing.T) {
	t.Parallel()
	res := runJob(t, newJob(t, sh("true"), nil))
	if res.Runtime.Engine != env.EngineName || res.Runtime.Runtime != sandbox.RuntimeRunc || res.Security.Runtime != sandbox.RuntimeRunc {
		t.Fatalf("engine %q runtime %q (security %q), want %q and runc", res.Runtime.Engine, res.Runtime.Runtime, res.Security.Runtime, env.EngineName)
	}
}
