// Package daemon tests `sandboxd serve` end to end on the real engine: the
// daemon runs as a subprocess (so that it can be SIGKILLed), and the tests
// talk to it through sandbox/client and raw HTTP on its socket.
package daemon

import (
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
	sbclient "github.com/sandboxd/sandboxd/sandbox/client"
)

var env *testharness.Env

func TestMain(m *testing.M) { os.Exit(testharness.Main(m, &env)) }

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	keyPath   string
	pubPEM    []byte
)

// binary builds sandboxd and a signing key once per run.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binPath = filepath.Join(env.Tmp, "sandboxd")
		if buildErr = testharness.GoBuild(env.Repo, "./cmd/sandboxd", binPath); buildErr != nil {
			return
		}
		var priv []byte
		priv, pubPEM, buildErr = receipt.GenerateKeyPair(nil)
		if buildErr != nil {
			return
		}
		keyPath = filepath.Join(env.Tmp, "daemon.key")
		buildErr = os.WriteFile(keyPath, priv, 0o600)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// daemon is one sandboxd serve process over a state directory that
// outlives it, so that a restart finds the same journal.
type daemon struct {
	t      *testing.T
	name   string // broker name: labels of everything it creates
	state  string
	socket string
	flags  []string
	cmd    *exec.Cmd
	done   chan struct{}
	logs   *syncBuffer
	client *sbclient.Client
	keys   sandbox.KeySet
	killed bool // SIGKILLed at least once
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newDaemon prepares (does not start) a daemon with a broker name of its
// own; its containers and cache volumes are removed, and checked gone, when
// the test ends.
func newDaemon(t *testing.T, flags ...string) *daemon {
	t.Helper()
	binary(t)
	dir, err := os.MkdirTemp("", "sbd-") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, name: env.BrokerName + "-" + randHex(3), state: filepath.Join(dir, "state"), socket: filepath.Join(dir, "s.sock"), flags: flags, logs: &syncBuffer{}}
	keys, err := sandbox.ParseKeySet(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	d.keys = keys
	d.client = sbclient.New(d.socket, keys)
	d.client.PollTimeout = 5 * time.Second
	t.Cleanup(func() {
		d.kill()
		d.client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// A daemon killed with sandboxes ready leaves them (its next start
		// reaps them; TestPooledSandboxesAfterSIGKILL); a stopped one
		// leaves none (stop checks).
		for _, l := range env.Leftovers(ctx, broker.LabelBroker+"="+d.name, broker.LabelRole+"=pool") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "container" {
				env.Eng.ContainerRemove(ctx, f[1], client.ContainerRemoveOptions{Force: true})
			}
		}
		if d.killed {
			d.removeKilledSelfchecks(ctx)
		}
		if left := env.Leftovers(ctx, broker.LabelBroker+"="+d.name, broker.LabelJob); len(left) > 0 {
			t.Errorf("daemon %s left job containers: %v", d.name, left)
			for _, l := range left {
				if f := strings.Fields(l); len(f) > 1 && f[0] == "container" {
					env.Eng.ContainerRemove(ctx, f[1], client.ContainerRemoveOptions{Force: true})
				}
			}
		}
		if err := broker.RemoveCache(ctx, env.Eng, d.name); err != nil {
			t.Errorf("remove cache of %s: %v", d.name, err)
		}
		if left := env.Leftovers(ctx, broker.LabelBroker+"="+d.name); len(left) > 0 {
			t.Errorf("daemon %s left: %v", d.name, left)
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", tail(d.logs.String(), 60))
		}
		os.RemoveAll(dir)
	})
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// start runs the daemon (with extra environment, e.g. a fault) and waits
// until it is ready.
func (d *daemon) start(extraEnv ...string) {
	d.t.Helper()
	d.launch(extraEnv...)
	hc := d.http()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://sandboxd/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-d.done:
			d.t.Fatalf("daemon exited at start: %s", tail(d.logs.String(), 20))
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// launch starts the daemon's process.
func (d *daemon) launch(extraEnv ...string) {
	d.t.Helper()
	args := append([]string{"serve", "--socket", d.socket, "--state", d.state, "--key", keyPath,
		"--name", d.name, "--reap-grace", "3s", "--drain-timeout", "20s"}, d.flags...)
	d.cmd = exec.Command(binPath, args...)
	d.cmd.Env = append(os.Environ(), "SANDBOXD_SHIM="+env.Shim, "SANDBOXD_PROBE="+env.Probe, "SANDBOXD_KEY_PASSWORD=")
	d.cmd.Env = append(d.cmd.Env, extraEnv...)
	d.cmd.Stderr = d.logs
	d.cmd.Stdout = d.logs
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func() {
		d.cmd.Wait()
		close(d.done)
	}()
}

// startFails starts the daemon, which must exit within the given time
// without serving; its logs.
func (d *daemon) startFails(within time.Duration) string {
	d.t.Helper()
	d.launch()
	select {
	case <-d.done:
	case <-time.After(within):
		d.t.Fatalf("daemon still running after %v, want it to exit at start: %s", within, tail(d.logs.String(), 20))
	}
	if d.cmd.ProcessState.Success() {
		d.t.Fatalf("daemon exited 0 at start, want a failure: %s", tail(d.logs.String(), 20))
	}
	return d.logs.String()
}

// stdout is a result's captured stdout, read from the daemon.
func (d *daemon) stdout(ctx context.Context, r sandbox.Result) string {
	d.t.Helper()
	if r.Stdout.Digest == "" {
		return ""
	}
	b, err := d.client.Blob(ctx, r.Stdout.Digest, 1<<20)
	if err != nil {
		d.t.Fatalf("stdout of %s: %v", r.JobID, err)
	}
	return string(b)
}

// notRun counts the times a start of the daemon proved that job id never
// ran and queued it to run (broker.ErrNotRun, or dispatched with no
// container bound).
func (d *daemon) notRun(id string) int { return d.countNotRun(id, false) }

// createdAgain counts the proofs of notRun that removed a container of
// the job: each is one container more than the job ran in. A job
// dispatched with no container bound may have had none yet (the process
// was killed before its create).
func (d *daemon) createdAgain(id string) int { return d.countNotRun(id, true) }

func (d *daemon) countNotRun(id string, removedOnly bool) int {
	n := 0
	for _, line := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(line, `"the job never ran; queued to run"`) && strings.Contains(line, `"job_id":"`+id+`"`) &&
			!(removedOnly && strings.Contains(line, `"removed_container":false`)) {
			n++
		}
	}
	return n
}

// kill SIGKILLs the daemon (if running) and waits for it.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	d.cmd = nil
	d.killed = true
}

// removeKilledSelfchecks removes the isolation selfcheck containers a
// SIGKILLed process of the daemon left with no start after it (the test's
// last kill): a start removes them (TestStartRemovesWhatAKilledProcessLeft).
// One past its deadline was the reaper's to remove, and stays a leftover.
func (d *daemon) removeKilledSelfchecks(ctx context.Context) {
	f := make(client.Filters).Add("label", broker.LabelBroker+"="+d.name, broker.LabelJob)
	cs, err := env.Eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		d.t.Errorf("list the containers of %s: %v", d.name, err)
		return
	}
	for _, c := range cs.Items {
		ms, err := strconv.ParseInt(c.Labels[broker.LabelDeadline], 10, 64)
		if !strings.HasPrefix(c.Labels[broker.LabelJob], "selfcheck-") || err != nil || time.Now().After(time.UnixMilli(ms)) {
			continue
		}
		d.t.Logf("removing selfcheck container %s of a killed daemon (deadline %s)", c.ID[:12], time.UnixMilli(ms).UTC().Format(time.RFC3339))
		env.Eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	}
}

// waitExit waits for the daemon to die on its own (an injected fault).
func (d *daemon) waitExit(timeout time.Duration) {
	d.t.Helper()
	select {
	case <-d.done:
		d.cmd = nil
	case <-time.After(timeout):
		d.t.Fatalf("daemon did not die within %v", timeout)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	d.t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if code := d.cmd.ProcessState.ExitCode(); code != 0 {
			d.t.Errorf("daemon exited %d after SIGTERM", code)
		}
		d.cmd = nil
		if left := env.Leftovers(context.Background(), broker.LabelBroker+"="+d.name, broker.LabelRole+"=pool"); len(left) > 0 {
			d.t.Errorf("a stopped daemon left pooled sandboxes: %v", left)
		}
	case <-time.After(40 * time.Second):
		d.t.Fatal("daemon did not stop after SIGTERM")
	}
}

// http returns a plain HTTP client on the socket.
func (d *daemon) http() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "unix", d.socket)
	}}, Timeout: time.Minute}
}

// rssKiB reads the daemon's resident set size.
func (d *daemon) rssKiB() int {
	d.t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	d.t.Fatal("no VmRSS")
	return 0
}

// followEvents hands each engine event matching f, from a second ago
// until stop is called, to handle (on one goroutine). The engine replays
// only a short buffer of past events, so the stream is followed live.
// stop lets the last events arrive and fails the test if the stream broke.
func (d *daemon) followEvents(f client.Filters, handle func(events.Message)) (stop func()) {
	d.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	res := env.Events(ctx, client.EventsListOptions{Since: strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10), Filters: f})
	var streamErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case m := <-res.Messages:
				handle(m)
			case err := <-res.Err:
				if ctx.Err() == nil {
					streamErr = err
				}
				return
			}
		}
	}()
	stopped := false
	d.t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	return func() {
		time.Sleep(500 * time.Millisecond) // let the last events arrive
		stopped = true
		cancel()
		<-done
		if streamErr != nil && !errors.Is(streamErr, io.EOF) {
			d.t.Fatalf("events: %v", streamErr)
		}
	}
}

// watchCreations counts container create events of this daemon's jobs,
// by job id and by job digest, from now until the returned function is
// called.
func (d *daemon) watchCreations() (stop func() (byID, byDigest map[string]int)) {
	d.t.Helper()
	f := make(client.Filters).Add("type", "container").Add("event", "create").
		Add("label", broker.LabelBroker+"="+d.name, broker.LabelRole+"=job")
	byID, byDigest := map[string]int{}, map[string]int{}
	end := d.followEvents(f, func(m events.Message) {
		byID[m.Actor.Attributes[broker.LabelJob]]++
		byDigest[m.Actor.Attributes[broker.LabelJobDigest]]++
	})
	return func() (map[string]int, map[string]int) {
		end()
		return byID, byDigest
	}
}

// metric reads one unlabelled series of the daemon's metrics.
func (d *daemon) metric(name string) float64 { return d.metrics(name)[0] }

// metrics reads unlabelled series from one scrape: figures read in
// separate scrapes may straddle a job's end and the next one's start.
func (d *daemon) metrics(names ...string) []float64 {
	d.t.Helper()
	fams := d.scrape()
	var out []float64
	for _, name := range names {
		fam := fams[name]
		if fam == nil || len(fam.Metric) != 1 {
			d.t.Fatalf("no single series %s", name)
		}
		m := fam.Metric[0]
		if m.Counter != nil {
			out = append(out, m.Counter.GetValue())
		} else {
			out = append(out, m.Gauge.GetValue())
		}
	}
	return out
}

// waitState polls a job's status until it reaches state.
func (d *daemon) waitState(ctx context.Context, id string, state sandbox.JobState) {
	d.t.Helper()
	for {
		st, err := d.client.Status(ctx, id)
		if err != nil {
			d.t.Fatal(err)
		}
		if st.State == state {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// histogram reads the count and sum of one series of a histogram of the
// daemon's metrics, the one whose label is label="value".
func (d *daemon) histogram(name, label, value string) (uint64, float64) {
	d.t.Helper()
	if fam := d.scrape()[name]; fam != nil {
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == label && l.GetValue() == value && m.Histogram != nil {
					return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
				}
			}
		}
	}
	d.t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0, 0
}

// scrape reads the daemon's metrics once.
func (d *daemon) scrape() map[string]*dto.MetricFamily {
	d.t.Helper()
	resp, err := d.http().Get("http://sandboxd/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		d.t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}
