package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
	sbclient "github.com/sandboxd/sandboxd/sandbox/client"
)

// A job asking more CPUs than this host has is refused at admission: 400
// invalid, naming the limit, the value asked and the host's most; nothing
// is journaled and no container of the daemon's name is created (the
// engine had refused it only at create, after a signed receipt, and the
// job ended error).
func TestJobBeyondTheHostIsRefusedAtAdmission(t *testing.T) {
	d := newDaemon(t)
	var creates []string
	stopEvents := d.followEvents(make(client.Filters).Add("type", "container").Add("event", "create").Add("label", broker.LabelBroker+"="+d.name),
		func(m events.Message) {
			creates = append(creates, m.Actor.Attributes["name"]+" (job "+m.Actor.Attributes[broker.LabelJob]+")")
		})
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	info, err := env.Eng.Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ncpu := info.Info.NCPU
	job := env.NewJob(t, testharness.Sh("echo must never run"), func(j *sandbox.Job) { j.Limits.CPUMillis = 256_000 })
	_, err = d.client.Submit(ctx, job)
	var ae *sbclient.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "invalid" || ae.Field != "job.limits.cpu_millis" || !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("submit of a 256-CPU job on a %d-CPU host: got %v, want 400 invalid on job.limits.cpu_millis", ncpu, err)
	}
	for _, want := range []string{"256000 (256 CPUs)", fmt.Sprintf("at most %d (%d CPUs", ncpu*1000, ncpu)} {
		if !strings.Contains(ae.Message, want) {
			t.Errorf("refusal %q does not say %q", ae.Message, want)
		}
	}
	resp, err := d.http().Get("http://sandboxd/v1/jobs/" + job.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the refused job: GET answered %d, want 404 (nothing journaled)", resp.StatusCode)
	}
	// The same host's most is accepted, and runs.
	fits := env.NewJob(t, testharness.Sh("echo fits"), func(j *sandbox.Job) { j.Limits.CPUMillis = int64(ncpu) * 1000 })
	if _, err := d.client.Submit(ctx, fits); err != nil {
		t.Fatalf("submit of a job asking the host's %d CPUs: %v", ncpu, err)
	}
	if sr, err := d.client.Wait(ctx, fits); err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("the job asking the host's CPUs: %v %+v, want succeeded", err, sr.Result)
	}
	d.stop()
	stopEvents()
	for _, c := range creates {
		if strings.Contains(c, job.ID) {
			t.Errorf("a container was created for the refused job: %s", c)
		}
	}
}

// Two daemons of one --name on one engine (two state directories): the
// second refuses to start, naming the first (it would reap the first's
// sandboxes); once the first is SIGKILLed, a daemon of the name starts
// again at once, and a clean stop leaves no mark of the name.
func TestSecondDaemonOfANameRefusesToStart(t *testing.T) {
	first := newDaemon(t)
	first.start()
	second := newDaemon(t)
	second.name = first.name

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "serve", "--socket", second.socket, "--state", second.state, "--key", keyPath, "--name", second.name)
	cmd.Env = append(os.Environ(), "SANDBOXD_SHIM="+env.Shim, "SANDBOXD_PROBE="+env.Probe, "SANDBOXD_KEY_PASSWORD=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState.ExitCode() != 4 {
		t.Errorf("second daemon: got %v after %v, want exit code 4", err, time.Since(start).Round(time.Millisecond))
	}
	for _, want := range []string{fmt.Sprintf("pid %d", first.cmd.Process.Pid), first.state, "stop that daemon, or give this one another --name"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("second daemon said %q, want it to name %q", tail(string(out), 5), want)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	t.Logf("the second daemon said: %s", tail(strings.TrimSpace(string(out)), 1))

	first.kill()
	start = time.Now()
	second.start()
	t.Logf("a daemon of the name started %v after its holder was SIGKILLed", time.Since(start).Round(time.Millisecond))
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the start after the holder was SIGKILLed took %v", d)
	}
	second.stop()
	if left := env.Leftovers(context.Background(), broker.LabelBroker+"="+second.name, broker.LabelRole+"=daemon"); len(left) > 0 {
		t.Errorf("a stopped daemon left marks of its name: %v", left)
	}
}
