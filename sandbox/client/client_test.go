package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/server"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// fakeBroker runs every job at once to a successful end, except that a
// job with a gate waits for it, and a job marked refused is refused as
// a broker refuses a job one of whose containers already exists.
type fakeBroker struct {
	mu      sync.Mutex
	runs    map[string]int
	gates   map[string]chan struct{}
	refused map[string]bool
}

var _ server.Broker = (*fakeBroker)(nil)

func (f *fakeBroker) Facts(context.Context) (sandbox.RuntimeFacts, error) {
	return sandbox.RuntimeFacts{BrokerVersion: "test", EngineVersion: "fake", Runtime: "runc"}, nil
}

func (f *fakeBroker) RunWithHooks(ctx context.Context, job sandbox.Job, h broker.Hooks) (sandbox.Result, error) {
	f.mu.Lock()
	f.runs[job.ID]++
	gate, refused := f.gates[job.ID], f.refused[job.ID]
	f.mu.Unlock()
	if refused {
		return sandbox.Result{}, fmt.Errorf("a container of job %s exists: %w", job.ID, sandbox.ErrConflict)
	}
	if err := h.OnCreated(ctx, "c-"+job.ID); err != nil {
		return sandbox.Result{}, err
	}
	h.OnStarted("c-"+job.ID, time.Now())
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	now := time.Now().UTC()
	return sandbox.Result{Schema: sandbox.ResultSchema, JobID: job.ID, JobDigest: job.Digest, Status: sandbox.StatusSucceeded,
		ExitCode: 0, StartedAt: now, EndedAt: now, LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{}}, nil
}

func (f *fakeBroker) RecoverWithHooks(ctx context.Context, job sandbox.Job, _ broker.Binding, _ broker.Hooks) (sandbox.Result, error) {
	return sandbox.Result{}, errors.New("nothing to recover in these tests")
}
func (f *fakeBroker) ListJobContainers(context.Context) ([]broker.JobContainer, error) {
	return nil, nil
}
func (f *fakeBroker) ListStalePoolContainers(context.Context) ([]broker.JobContainer, error) {
	return nil, nil
}
func (f *fakeBroker) RemoveJobContainer(string)                        {}
func (f *fakeBroker) RemoveUnboundContainer(sandbox.Job) (bool, error) { return false, nil }

func (f *fakeBroker) RemovePopulateContainers(context.Context) (int, error) { return 0, nil }

// ranOnce fails the test unless the job was run exactly once.
func (f *fakeBroker) ranOnce(t *testing.T, id string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.runs[id]; n != 1 {
		t.Errorf("job %s: got %d runs, want 1", id, n)
	}
}

// daemon is the real server handler on a unix socket, as sandboxd serve
// listens, with a fake broker behind it.
type daemon struct {
	fb     *fakeBroker
	socket string
	keys   sandbox.KeySet
	// drop, while positive, makes the daemon handle a submission and then
	// lose its answer (the connection closes), as a crash or a network
	// fault after the commit would.
	mu   sync.Mutex
	drop int
}

func newDaemon(t *testing.T) *daemon {
	t.Helper()
	dir := t.TempDir()
	jr, err := journal.Open(filepath.Join(dir, "journal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jr.Close() })
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{fb: &fakeBroker{runs: map[string]int{}, gates: map[string]chan struct{}{}, refused: map[string]bool{}}}
	cfg := server.Default()
	cfg.Broker, cfg.Blobs, cfg.Journal, cfg.Signer = d.fb, blobs, jr, signer
	cfg.ReapGrace, cfg.ReapInterval = time.Hour, time.Hour
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.socket = filepath.Join(dir, "sandboxd.sock")
	ln, err := net.Listen("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(d.lossy(srv.Handler()))
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		hs.Close()
	})
	if d.keys, err = sandbox.ParseKeySet(signer.PublicKeyPEM()); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *daemon) lossy(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		lose := d.drop > 0 && r.Method == http.MethodPost && r.URL.Path == "/v1/jobs"
		if lose {
			d.drop--
		}
		d.mu.Unlock()
		if !lose {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(httptest.NewRecorder(), r) // handled, committed, answer lost
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
	})
}

func (d *daemon) loseAnswers(n int) {
	d.mu.Lock()
	d.drop = n
	d.mu.Unlock()
}

func (d *daemon) client(t *testing.T) *client.Client {
	c := client.New(d.socket, d.keys)
	t.Cleanup(c.Close)
	return c
}

func newJob(t *testing.T, id string, argv ...string) sandbox.Job {
	t.Helper()
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: id, Image: "sha256:" + strings.Repeat("b", 64), Argv: argv, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

func TestSubmitAndWait(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	job := newJob(t, "job-1", "true")
	gate := make(chan struct{})
	d.fb.gates[job.ID] = gate

	rc, err := c.Submit(ctx, job)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if rc.Receipt.Job.ID != job.ID || rc.Receipt.Job.Digest != job.Digest {
		t.Errorf("got receipt for %s %s, want %s %s", rc.Receipt.Job.ID, rc.Receipt.Job.Digest, job.ID, job.Digest)
	}
	// Not ended yet: Result refuses, it does not block.
	if _, err := c.Result(ctx, job); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Result of a running job: got %v, want ErrNotFound", err)
	}
	done := make(chan error, 1)
	var res sandbox.SignedResult
	go func() {
		var err error
		res, err = c.Wait(ctx, job)
		done <- err
	}()
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.Result.Status != sandbox.StatusSucceeded || res.Result.JobDigest != job.Digest {
		t.Errorf("got result %s for %s, want succeeded for %s", res.Result.Status, res.Result.JobDigest, job.Digest)
	}
	if !bytes.Equal(res.Receipt.Envelope, rc.Envelope) {
		t.Errorf("the result is bound to another receipt than the one Submit returned")
	}
	again, err := c.Result(ctx, job)
	if err != nil || !bytes.Equal(again.Envelope, res.Envelope) {
		t.Errorf("Result after the end: got %v, a different envelope %v; want the same signed result", err, !bytes.Equal(again.Envelope, res.Envelope))
	}
	d.fb.ranOnce(t, job.ID)
}

// Submitting the same job again is answered with the receipt it already
// has; it does not run twice.
func TestResubmitIsIdempotent(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	job := newJob(t, "job-1", "true")
	first, err := c.Submit(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, job); err != nil {
		t.Fatal(err)
	}
	second, err := c.Submit(ctx, job)
	if err != nil {
		t.Fatalf("resubmit: %v", err)
	}
	if !bytes.Equal(first.Envelope, second.Envelope) {
		t.Errorf("resubmit: got a new receipt, want the one the job was accepted with")
	}
	d.fb.ranOnce(t, job.ID)
}

// An answer lost after the daemon accepted the job is asked for again
// with the same bytes, and the job still runs once.
func TestSubmitRetriesALostAnswer(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	job := newJob(t, "job-1", "true")
	d.loseAnswers(2)
	rc, err := c.Submit(ctx, job)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	st, err := c.Status(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal([]byte(st.Receipt), rc.Envelope) {
		t.Errorf("got a receipt other than the daemon's")
	}
	if _, err := c.Wait(ctx, job); err != nil {
		t.Fatal(err)
	}
	d.fb.ranOnce(t, job.ID)
}

// The same id with other content is a conflict, and the first job stands.
func TestSubmitConflict(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	job := newJob(t, "job-1", "true")
	gate := make(chan struct{})
	d.fb.gates[job.ID] = gate
	if _, err := c.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	other := newJob(t, "job-1", "false")
	_, err := c.Submit(ctx, other)
	var ae *client.APIError
	if !errors.Is(err, sandbox.ErrConflict) || !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict {
		t.Fatalf("got %v, want a 409 that is ErrConflict", err)
	}
	if !strings.Contains(err.Error(), job.Digest) {
		t.Errorf("got %q, want it to name the digest the id is bound to (%s)", err, job.Digest)
	}
	// Waiting with the other content is refused too, while the job runs
	// (short polls, so that the daemon answers before the job ends) and
	// after it ended: its result is not the other content's.
	c.PollTimeout = 10 * time.Millisecond
	shortCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Wait(shortCtx, other); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("Wait for the other content while the job runs: got %v, want ErrConflict", err)
	}
	close(gate)
	c.PollTimeout = 30 * time.Second
	res, err := c.Wait(ctx, job)
	if err != nil || res.Result.JobDigest != job.Digest {
		t.Errorf("the first job: got %v, digest %s, want its own result", err, res.Result.JobDigest)
	}
	if _, err := c.Wait(ctx, other); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("Wait for the other content after the end: got %v, want ErrConflict", err)
	}
	d.fb.ranOnce(t, job.ID)
}

func TestWaitUnknownJob(t *testing.T) {
	d := newDaemon(t)
	_, err := d.client(t).Wait(context.Background(), newJob(t, "never-submitted", "true"))
	if !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
}

// A job whose outcome cannot be proven ends uncertain: Wait returns its
// verified result and an error that is ErrUncertain.
func TestWaitUncertain(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	job := newJob(t, "job-1", "true")
	d.fb.refused[job.ID] = true
	if _, err := c.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, job)
	if !errors.Is(err, sandbox.ErrUncertain) {
		t.Fatalf("got %v, want ErrUncertain", err)
	}
	if res.Result.Status != sandbox.StatusUncertain || res.Result.JobDigest != job.Digest {
		t.Errorf("got result %s for %s, want a verified uncertain result for %s", res.Result.Status, res.Result.JobDigest, job.Digest)
	}
}

// When no answer comes back before the caller gives up, the submission is
// uncertain, not failed: the daemon may have accepted it, and the same job
// submitted again reconciles.
func TestSubmitUncertain(t *testing.T) {
	d := newDaemon(t)
	c := d.client(t)
	job := newJob(t, "job-1", "true")
	d.loseAnswers(1000)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.Submit(ctx, job)
	if !errors.Is(err, sandbox.ErrUncertain) {
		t.Fatalf("got %v, want ErrUncertain", err)
	}
	d.loseAnswers(0)
	if _, err := c.Submit(context.Background(), job); err != nil {
		t.Fatalf("resubmit: %v", err)
	}
	if _, err := c.Wait(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	d.fb.ranOnce(t, job.ID)
}

// A receipt signed by a key the client does not pin is refused.
func TestSubmitRefusesAnUnpinnedKey(t *testing.T) {
	d := newDaemon(t)
	other, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sandbox.ParseKeySet(other.PublicKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(d.socket, keys)
	defer c.Close()
	_, err = c.Submit(context.Background(), newJob(t, "job-1", "true"))
	if err == nil || !strings.Contains(err.Error(), "receipt") {
		t.Errorf("got %v, want the receipt refused", err)
	}
}
