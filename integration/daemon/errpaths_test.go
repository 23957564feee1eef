package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

// A daemon whose drain timed out with a job running exits non-zero (a
// supervisor sees it was not a clean stop), and its next start finishes
// the job.
func TestIncompleteDrainExitsNonZero(t *testing.T) {
	d := newDaemon(t, "--drain-timeout", "1s")
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	job := env.NewJob(t, testharness.Sh("sleep 6; echo done"), nil)
	if _, err := d.client.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	d.waitState(ctx, job.ID, "started")
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		t.Fatal("daemon did not exit after SIGTERM")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 4 {
		t.Errorf("got exit code %d after an incomplete drain, want 4", code)
	}
	// The drain timeout holds: the daemon stops while the job still runs,
	// and says so.
	if !strings.Contains(d.logs.String(), "drain incomplete") || !strings.Contains(d.logs.String(), "1 jobs still running") {
		t.Errorf("the log does not say the drain was incomplete and what happens next:\n%s", tail(d.logs.String(), 10))
	}
	d.cmd = nil
	d.start()
	sr, err := d.client.Wait(ctx, job)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if sr.Result.Status != sandbox.StatusSucceeded {
		t.Errorf("got %s (%s), want succeeded", sr.Result.Status, sr.Result.Cause)
	}
	d.stop()
}

// A second daemon on the same state directory stops at once, naming the
// process that holds it.
func TestSecondDaemonOnTheSameStateNamesTheHolder(t *testing.T) {
	d := newDaemon(t)
	d.start()
	other := filepath.Join(filepath.Dir(d.socket), "other.sock")
	cmd := exec.Command(binPath, "serve", "--socket", other, "--state", d.state, "--key", keyPath, "--name", d.name)
	cmd.Env = append(os.Environ(), "SANDBOXD_SHIM="+env.Shim, "SANDBOXD_PROBE="+env.Probe, "SANDBOXD_KEY_PASSWORD=")
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState.ExitCode() != 4 {
		t.Errorf("second daemon: got %v, want exit code 4", err)
	}
	if want := fmt.Sprintf("pid %d", d.cmd.Process.Pid); !strings.Contains(string(out), want) {
		t.Errorf("second daemon said %q, want it to name %s", out, want)
	}
	d.stop()
}

// sandboxd gc collects the daemon's caches and reports what they hold;
// the metrics say it too.
func TestGCCommandReportsTheCaches(t *testing.T) {
	d := newDaemon(t)
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	bundle := env.PutTree(t, map[string]string{"tests/": "", "tests/x": t.Name()})
	if err := d.client.PutBlob(ctx, bundle, env.Blob(t, bundle)); err != nil {
		t.Fatal(err)
	}
	job := env.NewJob(t, testharness.Sh("cat /bundle/tests/x"), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundle, Path: sandbox.BundlePath}}
	})
	if _, err := d.client.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	if sr, err := d.client.Wait(ctx, job); err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("wait: %v %+v", err, sr.Result)
	}
	out, err := exec.Command(binPath, "gc", "--socket", d.socket).Output()
	if err != nil {
		t.Fatalf("sandboxd gc: %v", err)
	}
	var rep struct {
		Blobs   struct{ Blobs, Bytes int64 }
		Volumes struct{ Volumes, Bytes int64 }
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.Blobs.Blobs == 0 || rep.Volumes.Volumes < 1 || rep.Volumes.Bytes == 0 {
		t.Errorf("sandboxd gc said %s (%v), want the blobs held and the input volumes (the job's, the selfcheck's)", out, err)
	}
	if got := d.metric("sandboxd_blob_store_bytes"); got != float64(rep.Blobs.Bytes) {
		t.Errorf("sandboxd_blob_store_bytes is %v, gc said %d", got, rep.Blobs.Bytes)
	}
	d.stop()
}
