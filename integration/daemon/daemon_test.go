package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSubmitWaitVerifyResubmit(t *testing.T) {
	d := newDaemon(t)
	creations := d.watchCreations()
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	job := env.NewJob(t, testharness.Sh(`mkdir -p /work/out && printf report > /work/out/r.txt && echo hello`), nil)
	rc, err := d.client.Submit(ctx, job)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if rc.Receipt.Job.Digest != job.Digest || rc.Receipt.Broker.Name != d.name || rc.Receipt.Broker.EphemeralKey {
		t.Errorf("got receipt %+v, want job %s by %s with a persistent key", rc.Receipt.Broker, job.Digest, d.name)
	}
	sr, err := d.client.Wait(ctx, job)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("got status %s (%s), want succeeded", sr.Result.Status, sr.Result.Cause)
	}
	art, ok := sr.Result.Artifact("/work/out/r.txt")
	if !ok {
		t.Fatalf("no artifact /work/out/r.txt in %+v", sr.Result.Artifacts)
	}
	if b, err := d.client.Blob(ctx, art.Digest, 1<<20); err != nil || string(b) != "report" {
		t.Errorf("artifact: got %q, %v, want %q", b, err, "report")
	}
	if b, err := d.client.Blob(ctx, sr.Result.Stdout.Digest, 1<<20); err != nil || string(b) != "hello\n" {
		t.Errorf("stdout: got %q, %v, want %q", b, err, "hello\n")
	}

	// The same job again: the same bytes, nothing new runs.
	rc2, err := d.client.Submit(ctx, job)
	if err != nil {
		t.Fatalf("resubmit: %v", err)
	}
	sr2, err := d.client.Result(ctx, job)
	if err != nil {
		t.Fatalf("result: %v", err)
	}
	if !bytes.Equal(rc.Envelope, rc2.Envelope) || !bytes.Equal(sr.Envelope, sr2.Envelope) {
		t.Errorf("resubmission changed the receipt or result bytes")
	}
	// Another job under the same id: 409, and no container for it.
	other := env.NewJob(t, testharness.Sh("echo other"), func(j *sandbox.Job) { j.ID = job.ID })
	if _, err := d.client.Submit(ctx, other); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("other job under the same id: got %v, want ErrConflict", err)
	}
	byID, byDigest := creations()
	if byID[job.ID] != 1 || byDigest[other.Digest] != 0 {
		t.Errorf("got %d containers for the job and %d for the conflicting one, want 1 and 0", byID[job.ID], byDigest[other.Digest])
	}
	id, err := d.client.Identity(ctx)
	if err != nil || id.PublicKey != string(pubPEM) || id.Runtime.EngineVersion == "" {
		t.Errorf("identity: got %+v, %v, want the pinned key and engine facts", id, err)
	}
	d.stop()
}

func TestRefusalsNameTheProblemAndChangeNothing(t *testing.T) {
	d := newDaemon(t)
	d.start()
	hc := d.http()
	good := env.NewJob(t, []string{"true"}, nil)
	goodJSON, _ := json.Marshal(good)
	var m map[string]any
	json.Unmarshal(goodJSON, &m)
	m["priority"] = 9
	unknownJSON, _ := json.Marshal(m)
	noImage := env.NewJob(t, []string{"true"}, func(j *sandbox.Job) { j.Image = "sha256:" + strings.Repeat("0", 64) })
	noImageJSON, _ := json.Marshal(noImage)
	missingInput := env.NewJob(t, []string{"true"}, func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "ws", Digest: sandbox.DigestBytes([]byte("never uploaded")), Path: "/inputs/ws"}}
	})
	missingInputJSON, _ := json.Marshal(missingInput)
	tests := []struct {
		name, method, path string
		body               []byte
		code               int
		want               string
	}{
		{"malformed json", "POST", "/v1/jobs", []byte(`{"schema": "sandboxd.job/v1",`), 400, "job: invalid"},
		{"unknown field", "POST", "/v1/jobs", unknownJSON, 400, `unknown field "priority"`},
		{"oversize body", "POST", "/v1/jobs", bytes.Repeat([]byte("x"), 2<<20), 413, "larger than"},
		{"wrong digest claim", "PUT", "/v1/blobs/" + sandbox.DigestBytes([]byte("claimed")), []byte("actual"), 400, "digest mismatch"},
		{"missing image", "POST", "/v1/jobs", noImageJSON, 422, "not present in the engine"},
		{"missing input blob", "POST", "/v1/jobs", missingInputJSON, 400, "job.inputs[0].digest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, "http://sandboxd"+tc.path, bytes.NewReader(tc.body))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, b, tc.code)
			}
			var e struct{ Error string }
			if json.Unmarshal(b, &e); !strings.Contains(e.Error, tc.want) {
				t.Errorf("got message %q, want it to name %q", e.Error, tc.want)
			}
		})
	}
	ctx := ctxFor(t, time.Minute)
	for _, j := range []sandbox.Job{good, noImage, missingInput} {
		if _, err := d.client.Status(ctx, j.ID); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("job %s: got %v, want not in the journal", j.ID, err)
		}
	}
	if _, err := d.client.Blob(ctx, sandbox.DigestBytes([]byte("actual")), 100); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("mismatched upload: got %v, want it not stored", err)
	}
	d.stop()
}

func TestQueueFullAnswers429AndEveryAcceptedJobFinishes(t *testing.T) {
	d := newDaemon(t, "--concurrency", "1", "--queue", "1")
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	slow := env.NewJob(t, testharness.Sh("sleep 3"), nil)
	queued := env.NewJob(t, []string{"true"}, nil)
	refused := env.NewJob(t, []string{"true"}, nil)
	if _, err := d.client.Submit(ctx, slow); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := d.client.Status(ctx, slow.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == "started" {
			break
		}
		if st.Terminal() {
			t.Fatalf("slow job ended early: %s", st.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := d.client.Submit(ctx, queued); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(refused)
	resp, err := d.http().Post("http://sandboxd/v1/jobs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("got %d with Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if _, err := d.client.Status(ctx, refused.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("refused job: got %v, want not journaled", err)
	}
	// The client waits out Retry-After: the refused job gets in later.
	if _, err := d.client.Submit(ctx, refused); err != nil {
		t.Errorf("submit after the queue drained: %v", err)
	}
	for _, j := range []sandbox.Job{slow, queued, refused} {
		sr, err := d.client.Wait(ctx, j)
		if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
			t.Errorf("%s: got %s, %v, want succeeded", j.ID, sr.Result.Status, err)
		}
	}
	d.stop()
}

// TestSIGKILLAtEachStep kills the daemon at each point of a job's life and
// restarts it: the job ends finished or uncertain, its container was
// created at most once, and nothing is left.
func TestSIGKILLAtEachStep(t *testing.T) {
	tests := []struct {
		step string
		argv []string
		want sandbox.Status
	}{
		// Accepted, never dispatched: provably never ran, so it runs now.
		{"accepted", []string{"true"}, sandbox.StatusSucceeded},
		// Dispatched, killed before its container's create: no container
		// is bound, none exists, so it runs now, in its first container
		// (CI: the fleet soak counted a second one it never had).
		{"dispatched", testharness.Sh("echo once"), sandbox.StatusSucceeded},
		// Created, never started: provably never ran (the engine says
		// so), so it runs now, in a new container.
		{"created", testharness.Sh("echo once"), sandbox.StatusSucceeded},
		// Started, killed before the helper got its config over the
		// attached stdin: its stream ends before the command's start,
		// which proves it never ran, so it runs now.
		{"started", testharness.Sh("echo once"), sandbox.StatusSucceeded},
		// Running (killed from outside a second into the command): the
		// restarted daemon waits for it and reads its stream back.
		{"running", testharness.Sh("sleep 3; echo done"), sandbox.StatusSucceeded},
		// Exited, result not journaled: the broker already removed the
		// container, so the outcome cannot be proven.
		// The result is journaled while the container still exists, so a
		// crash right after the exit is recovered from the container.
		{"exited", []string{"true"}, sandbox.StatusSucceeded},
	}
	for _, tc := range tests {
		t.Run(tc.step, func(t *testing.T) {
			d := newDaemon(t)
			creations := d.watchCreations()
			job := env.NewJob(t, tc.argv, nil)
			ctx := ctxFor(t, 2*time.Minute)
			if tc.step == "running" {
				d.start()
				if _, err := d.client.Submit(ctx, job); err != nil {
					t.Fatal(err)
				}
				d.waitState(ctx, job.ID, "started")
				time.Sleep(time.Second)
				d.kill()
			} else {
				d.start("SANDBOXD_TEST_FAULT=" + tc.step + ":" + job.ID)
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := d.client.Submit(sctx, job)
				cancel()
				if tc.step == "accepted" && !errors.Is(err, sandbox.ErrUncertain) {
					t.Errorf("submit through a crash: got %v, want ErrUncertain", err)
				}
				d.waitExit(time.Minute)
			}
			d.start()
			// Reconcile with the same job, never a new id.
			rc, err := d.client.Submit(ctx, job)
			if err != nil {
				t.Fatalf("resubmit after restart: %v", err)
			}
			sr, err := d.client.Wait(ctx, job)
			if tc.want == sandbox.StatusUncertain {
				if !errors.Is(err, sandbox.ErrUncertain) {
					t.Errorf("got %v, want ErrUncertain", err)
				}
			} else if err != nil {
				t.Fatalf("wait: %v", err)
			}
			if sr.Result.Status != tc.want {
				t.Errorf("got %s (%s), want %s", sr.Result.Status, sr.Result.Cause, tc.want)
			}
			if !bytes.Equal(sr.Receipt.Envelope, rc.Envelope) {
				t.Errorf("the result is chained to another receipt")
			}
			// A job proven never run gets a second container, and its
			// command runs once, in that one.
			wantCreations := 1 + d.createdAgain(job.ID)
			if tc.step == "dispatched" || tc.step == "created" || tc.step == "started" {
				if d.notRun(job.ID) != 1 {
					t.Errorf("the restarted daemon proved %d times that the job never ran, want once", d.notRun(job.ID))
				}
				if out := d.stdout(ctx, sr.Result); out != "once\n" {
					t.Errorf("stdout %q, want the command's one run", out)
				}
			}
			d.stop()
			byID, _ := creations()
			if byID[job.ID] != wantCreations {
				t.Errorf("got %d container creations for the job, want exactly %d", byID[job.ID], wantCreations)
			}
		})
	}
}

func TestHundredJobsAtConcurrencyFour(t *testing.T) {
	const n = 100
	d := newDaemon(t, "--concurrency", "4", "--queue", "16")
	creations := d.watchCreations()
	d.start()
	ctx := ctxFor(t, 4*time.Minute)
	warm := env.NewJob(t, []string{"true"}, nil)
	if _, err := d.client.Submit(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Wait(ctx, warm); err != nil {
		t.Fatal(err)
	}
	rssBefore := d.rssKiB()
	jobs := make([]sandbox.Job, n)
	for i := range jobs {
		jobs[i] = env.NewJob(t, []string{"true"}, nil)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := d.client.Submit(ctx, j); err != nil {
				errs <- fmt.Errorf("submit %s: %w", j.ID, err)
				return
			}
			sr, err := d.client.Wait(ctx, j)
			if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
				errs <- fmt.Errorf("%s: got %s, %v, want succeeded", j.ID, sr.Result.Status, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wall := time.Since(start)
	rssAfter := d.rssKiB()
	t.Logf("%d jobs at concurrency 4: wall %v; daemon RSS %d KiB after warm-up, %d KiB after", n, wall.Round(time.Millisecond), rssBefore, rssAfter)
	if rssAfter > rssBefore+64<<10 {
		t.Errorf("daemon RSS grew from %d KiB to %d KiB, want under 64 MiB growth", rssBefore, rssAfter)
	}

	// A job's result is durable (and waitable) just before its container
	// is removed and it stops counting as running: give the last removals
	// a moment.
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := d.http().Get("http://sandboxd/metrics")
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("metrics do not parse: %v", err)
		}
		if g := fams["sandboxd_jobs_running"]; g == nil || len(g.Metric) == 0 || g.Metric[0].Gauge.GetValue() == 0 || time.Now().After(deadline) {
			break
		}
	}
	value := func(name, label, val string) float64 {
		fam := fams[name]
		if fam == nil {
			t.Fatalf("no metric %s", name)
		}
		for _, m := range fam.Metric {
			match := label == ""
			for _, lp := range m.Label {
				match = match || (lp.GetName() == label && lp.GetValue() == val)
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
		return 0
	}
	checks := []struct {
		name, label, val string
		want             float64
	}{
		{"sandboxd_jobs_accepted_total", "", "", n + 1},
		{"sandboxd_jobs_finished_total", "status", "succeeded", n + 1},
		{"sandboxd_envelopes_signed_total", "kind", "receipt", n + 1},
		{"sandboxd_envelopes_signed_total", "kind", "result", n + 1},
		{"sandboxd_job_duration_seconds", "", "", n + 1},
		{"sandboxd_container_start_seconds", "", "", n + 1},
		{"sandboxd_jobs_running", "", "", 0},
		{"sandboxd_queue_depth", "", "", 0},
	}
	for _, c := range checks {
		if got := value(c.name, c.label, c.val); got != c.want {
			t.Errorf("%s{%s=%q}: got %v, want %v", c.name, c.label, c.val, got, c.want)
		}
	}
	usedPool := value("sandboxd_pool_used_total", "", "")
	t.Logf("%v of %d jobs ran in pooled sandboxes", usedPool, n+1)
	d.stop()
	byID, _ := creations()
	for id := range byID {
		if strings.HasPrefix(id, "selfcheck") {
			delete(byID, id) // the daemon's isolation selfcheck before the first job
		}
	}
	// A job runs in a container created for it or in one of the pool,
	// never in both and never twice.
	if pooled := int(usedPool); len(byID)+pooled != n+1 {
		t.Errorf("got containers created for %d jobs and %d jobs in pooled sandboxes, want %d in all", len(byID), pooled, n+1)
	}
	for id, c := range byID {
		if c != 1 {
			t.Errorf("job %s: %d containers, want 1", id, c)
		}
	}
}

// A job that took a pooled sandbox is recovered from it after a SIGKILL as
// one whose container was created for it: the journal names the sandbox,
// the restarted daemon waits for it under the job's deadline and reads its
// stream back. The sandbox left ready is reaped, and no job runs in it.
func TestPooledSandboxesAfterSIGKILL(t *testing.T) {
	d := newDaemon(t, "--pool", "2")
	d.start()
	ctx := ctxFor(t, 3*time.Minute)
	warm := env.NewJob(t, []string{"true"}, nil)
	if _, err := d.client.Submit(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Wait(ctx, warm); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); d.metric("sandboxd_pool_ready") != 2 || d.metric("sandboxd_pool_starting") != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool did not fill")
		}
	}
	// It runs past the restarted daemon's first reap (--reap-grace 3s):
	// the reaper must leave a pooled container the journal names.
	job := env.NewJob(t, testharness.Sh("sleep 6; echo done"), nil)
	if _, err := d.client.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	d.waitState(ctx, job.ID, "started")
	if used := d.metric("sandboxd_pool_used_total"); used != 1 {
		t.Fatalf("pool used %v times, want 1", used)
	}
	time.Sleep(time.Second)
	d.kill()

	d.start()
	sr, err := d.client.Wait(ctx, job)
	if err != nil || sr.Result.Status != sandbox.StatusSucceeded || sr.Result.Stdout.Total != int64(len("done\n")) {
		t.Fatalf("recovered: %v %s (%s) stdout %d bytes", err, sr.Result.Status, sr.Result.Cause, sr.Result.Stdout.Total)
	}
	pooled := func() []string {
		return env.Leftovers(ctx, broker.LabelBroker+"="+d.name, broker.LabelRole+"=pool")
	}
	for deadline := time.Now().Add(time.Minute); len(pooled()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stale pooled sandboxes not reaped: %v", pooled())
		}
	}
	d.stop()
}

// The daemon killed while a job takes a pooled sandbox, after the binding
// was journaled (created) or after its start was (started), before the
// helper got its config: the sandbox's stream proves the job never ran,
// the sandbox is removed, and the job runs for the first time.
func TestSIGKILLWhileTakingAPooledSandbox(t *testing.T) {
	for _, step := range []string{"created", "started"} {
		t.Run(step, func(t *testing.T) {
			d := newDaemon(t, "--pool", "1")
			d.start()
			ctx := ctxFor(t, 2*time.Minute)
			warm := env.NewJob(t, []string{"true"}, nil)
			if _, err := d.client.Submit(ctx, warm); err != nil {
				t.Fatal(err)
			}
			if _, err := d.client.Wait(ctx, warm); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); d.metric("sandboxd_pool_ready") != 1 || d.metric("sandboxd_pool_starting") != 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the pool did not fill")
				}
			}
			d.stop()
			// A long wall time: were recovery to wait for the job's
			// deadline, the wait below would end with ctx, not a result.
			job := env.NewJob(t, testharness.Sh("echo once"), func(j *sandbox.Job) { j.Limits.WallTimeMS = 600_000 })
			d.start("SANDBOXD_TEST_FAULT=" + step + ":" + job.ID)
			// The restarted daemon has no pool yet: warm it again.
			warm2 := env.NewJob(t, []string{"true"}, nil)
			if _, err := d.client.Submit(ctx, warm2); err != nil {
				t.Fatal(err)
			}
			if _, err := d.client.Wait(ctx, warm2); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); d.metric("sandboxd_pool_ready") != 1 || d.metric("sandboxd_pool_starting") != 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the pool did not fill")
				}
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d.client.Submit(sctx, job)
			cancel()
			d.waitExit(time.Minute)
			// The job took the pooled sandbox: it bears the job's name.
			insp, err := env.Eng.ContainerInspect(ctx, broker.ContainerName(d.name, job.ID, job.Digest), client.ContainerInspectOptions{})
			if err != nil || insp.Container.Config.Labels[broker.LabelRole] != "pool" {
				t.Fatalf("the job's container is not a pooled sandbox: %v", err)
			}
			d.start()
			sr, err := d.client.Wait(ctx, job)
			if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
				t.Fatalf("got %v %s (%s), want succeeded", err, sr.Result.Status, sr.Result.Cause)
			}
			if out := d.stdout(ctx, sr.Result); out != "once\n" || d.notRun(job.ID) != 1 {
				t.Errorf("stdout %q after %d proofs that it never ran, want the command's one run after one", out, d.notRun(job.ID))
			}
			d.stop()
		})
	}
}
