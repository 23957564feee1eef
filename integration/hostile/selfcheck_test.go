package hostile

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/filedigest"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/selfcheck"
	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/sandbox"
)

var update = flag.Bool("update", false, "rewrite internal/selfcheck/testdata from this engine")

func probeBinary(t *testing.T) []byte {
	t.Helper()
	probeInput(t) // builds it
	b, err := os.ReadFile(filepath.Join(env.Tmp, "sandboxd-probe"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// probeFile is the probe as the selfcheck takes it: a file known by its
// digest; with extra bytes, a copy of it with those appended.
func probeFile(t *testing.T, extra ...byte) filedigest.File {
	t.Helper()
	p := filepath.Join(env.Tmp, "sandboxd-probe")
	if len(extra) > 0 {
		p = filepath.Join(t.TempDir(), "sandboxd-probe")
		if err := os.WriteFile(p, append(probeBinary(t), extra...), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	probeInput(t) // builds it
	f, err := filedigest.Open(p, "")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func selfcheckOptions(t *testing.T, state string) selfcheck.Options {
	return selfcheck.Options{
		Broker: env.Broker, Blobs: env.Blobs, Engine: env.Eng, Image: env.Minimal,
		Probe: probeFile(t), CandidateUID: env.Cfg.CandidateUID, CandidateGID: env.Cfg.CandidateGID,
		StateDir: state, Runtime: env.Runtime,
	}
}

// TestSelfcheckPassesAndCaches runs the real self-check on this engine:
// every property must hold, and the second call must come from the cache.
func TestSelfcheckPassesAndCaches(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	o := selfcheckOptions(t, state)
	r, err := selfcheck.Ensure(context.Background(), o)
	if err != nil {
		if r != nil {
			for _, p := range r.Failed() {
				t.Errorf("property %s failed: %s", p.Name, p.Detail)
			}
		}
		t.Fatalf("Ensure: %v", err)
	}
	if r.Cached || !r.OK {
		t.Fatalf("first check: cached %v ok %v, want a fresh pass", r.Cached, r.OK)
	}
	if n := len(r.Properties); n < 100 {
		t.Errorf("only %d properties evaluated", n)
	}
	again, err := selfcheck.Ensure(context.Background(), o)
	if err != nil || !again.Cached {
		t.Fatalf("second check: cached %v err %v, want the cached pass", again != nil && again.Cached, err)
	}
	files, _ := filepath.Glob(filepath.Join(state, "selfcheck", "*.json"))
	if len(files) != 1 {
		t.Errorf("cache files %v, want exactly one", files)
	}
	// A forced check that fails removes the pass it could not confirm
	// (the candidate ids are not part of the key: this check has the
	// pass's key): the next process checks again rather than run jobs on
	// the old pass.
	wrong := o
	wrong.CandidateUID++
	if _, err := selfcheck.Recheck(context.Background(), wrong); !errors.Is(err, selfcheck.ErrFailed) {
		t.Fatalf("a recheck expecting another uid: %v, want it to fail", err)
	}
	if r, err := selfcheck.Ensure(context.Background(), o); err != nil || r.Cached {
		t.Fatalf("after a failed recheck: cached %v err %v, want a fresh pass", r != nil && r.Cached, err)
	}
	// A forced check that passes replaces the cached pass.
	if r, err := selfcheck.Recheck(context.Background(), o); err != nil || r.Cached {
		t.Fatalf("recheck: cached %v err %v, want a fresh pass", r != nil && r.Cached, err)
	}
	if r, err := selfcheck.Ensure(context.Background(), o); err != nil || !r.Cached {
		t.Fatalf("after a recheck: cached %v err %v, want its pass", r != nil && r.Cached, err)
	}
	// A different probe is a different key: the cache does not answer.
	o.Probe = probeFile(t, 0)
	third, err := selfcheck.Ensure(context.Background(), o)
	if err != nil || third.Cached {
		t.Fatalf("changed probe: cached %v err %v, want a fresh pass", third != nil && third.Cached, err)
	}
	if *update {
		name := "sandbox.json"
		if env.Runtime == sandbox.RuntimeRunsc {
			name = "sandbox-runsc.json" // gVisor's forms, judged only for runsc
		}
		writeFixture(t, name, r.Probe)
	}
}

// TestSelfcheckNegativeControl runs the same probe in a container weakened
// on purpose, created directly with the engine client (never through the
// broker): seccomp unconfined, CAP_SYS_ADMIN added, no no-new-privileges, a
// writable root filesystem, a private /dev/shm, the engine's own
// resolv.conf, the host's cgroup namespace, and root. The network stays
// "none". The evaluator must fail
// and name each weakened property.
func TestSelfcheckNegativeControl(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	out := runWeakened(t, []string{"/sandboxd-probe", "report", "-connect", ln.Addr().String(), "-readonly", "/etc"})
	var rep probe.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("weakened container's report: %v\n%s", err, out)
	}
	props := selfcheck.Properties(rep, selfcheck.Expect{
		CandidateUID: 65534, CandidateGID: 65534,
		Env: map[string]string{"HOME": "/work", "HOSTNAME": "sandbox"}, Hostname: "sandbox",
		Connect: true, ReadOnly: []string{"/etc"},
	})
	failed := map[string]bool{}
	for _, p := range selfcheck.Failed(props) {
		failed[p.Name] = true
	}
	weakened := []string{
		"candidate-user", "capabilities-eff", "capabilities-prm", "capabilities-bounding",
		"no-new-privileges", "seccomp-filter",
		"syscall-unshare", "syscall-clone3", "syscall-mount", "syscall-open_tree", "syscall-name_to_handle_at",
		"syscall-io_uring_setup", "syscall-kcmp", "syscall-personality",
		"socket-AF_INET/raw", "socket-AF_PACKET/raw",
		"root-read-only", "write-create /", "write-create /etc", "dev-shm", "resolv-conf", "environment", "hostname", "cgroup-namespace",
	}
	// A kernel built without the i386 ABI (some of CI's machines)
	// faults the call whatever the filter: there the property holds even
	// unconfined, as the hostile case abi-i386 skips.
	if a := rep.ForeignABI; a != nil && strings.HasPrefix(a.Outcome, "fault: ") {
		t.Logf("this kernel has no i386 ABI (%s): foreign-abi cannot fail here", a.Outcome)
	} else {
		weakened = append(weakened, "foreign-abi")
	}
	for _, want := range weakened {
		if !failed[want] {
			t.Errorf("weakened container: property %s held, want it to fail", want)
		}
	}
	// What the weakening did not touch still holds: the check names the
	// weakened properties, not everything.
	for _, held := range []string{"network-interfaces", "host-loopback", "masked-/proc/kcore", "masked-/proc/keys", "write-/proc/sys/kernel/hostname"} {
		if failed[held] {
			t.Errorf("weakened container: property %s failed, want it to hold (the control did not weaken it)", held)
		}
	}
	if *update {
		writeFixture(t, "weakened.json", rep)
	}
}

func writeFixture(t *testing.T, name string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(env.Repo, "internal", "selfcheck", "testdata", name), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runWeakened runs argv in a deliberately weakened container of the
// minimal image with the probe at /sandboxd-probe and returns its stdout.
// The container carries the job label, so the harness catches a leak, and
// is removed on every path.
func runWeakened(t *testing.T, argv []string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The negative control runs on Docker on either engine: it proves the
	// probe sees a weakened sandbox, and the containerd engine refuses to
	// make one at all (spec.go).
	created, err := env.Docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: "sandboxd-negative-control-" + fmt.Sprint(time.Now().UnixNano()),
		Config: &container.Config{
			Image: env.Minimal, Entrypoint: argv, Cmd: []string{}, User: "0:0", Env: []string{},
			Labels: map[string]string{broker.LabelJob: "negative-control", broker.LabelBroker: env.BrokerName},
		},
		HostConfig: &container.HostConfig{
			NetworkMode:    "none",
			CapAdd:         []string{"CAP_SYS_ADMIN"},
			SecurityOpt:    []string{"seccomp=unconfined"},
			ReadonlyRootfs: false,
			IpcMode:        container.IPCModePrivate,
			CgroupnsMode:   container.CgroupnsModeHost,
			LogConfig:      container.LogConfig{Type: "json-file"},
		},
	})
	if err != nil {
		t.Fatalf("create weakened container: %v", err)
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		if _, err := env.Docker.ContainerRemove(rctx, created.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			t.Errorf("remove weakened container: %v", err)
		}
	}()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	bin := probeBinary(t)
	tw.WriteHeader(&tar.Header{Name: "sandboxd-probe", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg})
	tw.Write(bin)
	tw.Close()
	if _, err := env.Docker.CopyToContainer(ctx, created.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: &buf}); err != nil {
		t.Fatalf("copy the probe in: %v", err)
	}
	wait := env.Docker.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
	if _, err := env.Docker.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start weakened container: %v", err)
	}
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 {
			t.Errorf("weakened container exited %d", res.StatusCode)
		}
	case err := <-wait.Error:
		t.Fatalf("wait: %v", err)
	}
	logs, err := env.Docker.ContainerLogs(ctx, created.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, logs); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("read logs: %v", err)
	}
	if stderr.Len() > 0 {
		t.Logf("weakened container stderr: %s", strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes()
}
