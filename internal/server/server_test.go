package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// fakeBroker is an in-memory broker: every run "creates" a container,
// starts it, waits for the job's gate (if any) and succeeds.
type fakeBroker struct {
	mu        sync.Mutex
	runs      map[string]int
	recovered map[string]string
	gates     map[string]chan struct{}
	existing  []broker.JobContainer
	stale     []broker.JobContainer // pooled containers of an earlier process
	removed   []string
	// populating counts the populate containers an earlier process left.
	populating int
	// reclaim are the jobs run with Hooks.ReclaimName.
	reclaim []string
	// removeUnboundErr is what RemoveUnboundContainer answers.
	removeUnboundErr error
	bindings         map[string]broker.Binding
	// recoverGates hold a recovered job's container "running" until
	// closed; active counts jobs running or being recovered in the fake,
	// maxActive the most at once, order the jobs in the order they ran.
	recoverGates      map[string]chan struct{}
	active, maxActive int
	order             []string
	// finish makes a run hand its result to OnFinished, as the real
	// broker does, and keep the container when that fails.
	finish bool
	// outputs makes a run's result name an artifact and a stdout log.
	outputs bool
	// orphanShims are the engine's shims that serve no container, and
	// orphanErr what ending them fails with; removedWhenShimsEnded is
	// what removed held when they were ended.
	orphanShims           []string
	orphanErr             error
	listErr               error // what ListJobContainers fails with
	removedWhenShimsEnded []string
}

func (f *fakeBroker) enter(id string, run bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active++
	f.maxActive = max(f.maxActive, f.active)
	if run {
		f.order = append(f.order, id)
	}
}

func (f *fakeBroker) leave() {
	f.mu.Lock()
	f.active--
	f.mu.Unlock()
}

// fake is the fakeBroker under a test's wrapper of it.
func (f *fakeBroker) fake() *fakeBroker { return f }

func newFake() *fakeBroker {
	return &fakeBroker{runs: map[string]int{}, recovered: map[string]string{}, gates: map[string]chan struct{}{}, bindings: map[string]broker.Binding{}}
}

func (f *fakeBroker) Facts(context.Context) (sandbox.RuntimeFacts, error) {
	return sandbox.RuntimeFacts{BrokerVersion: "test", EngineVersion: "fake", Runtime: "runc"}, nil
}

func (f *fakeBroker) result(job sandbox.Job) sandbox.Result {
	now := time.Now().UTC()
	res := sandbox.Result{Schema: sandbox.ResultSchema, JobID: job.ID, JobDigest: job.Digest, Status: sandbox.StatusSucceeded,
		StartedAt: now, EndedAt: now, LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{}}
	if f.outputs {
		res.Artifacts = []sandbox.Artifact{{Path: "/work/out/a", Digest: fakeArtifact(job.ID), Size: 1, MediaType: "application/octet-stream"}}
		res.Stdout = sandbox.Log{Digest: fakeStdout(job.ID), Bytes: 1, Total: 1}
	}
	return res
}

// fakeArtifact and fakeStdout are the digests of the outputs a fake run
// names (the fake writes no blobs).
func fakeArtifact(id string) string { return sandbox.DigestBytes([]byte("artifact of " + id)) }
func fakeStdout(id string) string   { return sandbox.DigestBytes([]byte("stdout of " + id)) }

func (f *fakeBroker) RunWithHooks(ctx context.Context, job sandbox.Job, h broker.Hooks) (sandbox.Result, error) {
	f.mu.Lock()
	f.runs[job.ID]++
	if h.ReclaimName {
		f.reclaim = append(f.reclaim, job.ID)
	}
	gate := f.gates[job.ID]
	f.mu.Unlock()
	f.enter(job.ID, true)
	defer f.leave()
	if err := h.OnCreated(ctx, "c-"+job.ID); err != nil {
		return sandbox.Result{}, err
	}
	h.OnStarted("c-"+job.ID, time.Now())
	res := f.result(job)
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			res.Status, res.Cause = sandbox.StatusCancelled, "cancelled"
		}
	}
	if f.finish {
		if err := h.OnFinished(ctx, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (f *fakeBroker) RecoverWithHooks(ctx context.Context, job sandbox.Job, bind broker.Binding, hooks broker.Hooks) (sandbox.Result, error) {
	f.mu.Lock()
	f.recovered[job.ID] = bind.ContainerID
	f.bindings[job.ID] = bind
	gate := f.recoverGates[job.ID]
	f.mu.Unlock()
	f.enter(job.ID, false)
	defer f.leave()
	if gate != nil {
		<-gate
	}
	res := f.result(job)
	if hooks.OnFinished != nil {
		if err := hooks.OnFinished(ctx, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (f *fakeBroker) ListJobContainers(context.Context) ([]broker.JobContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	return slices.Clone(f.existing), nil
}

func (f *fakeBroker) ListStalePoolContainers(context.Context) ([]broker.JobContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.stale), nil
}

func (f *fakeBroker) RemoveUnboundContainer(job sandbox.Job) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, "name:"+job.ID)
	return f.removeUnboundErr == nil, f.removeUnboundErr
}

func (f *fakeBroker) RemovePopulateContainers(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.populating
	f.populating = 0
	return n, nil
}

func (f *fakeBroker) EndOrphanedShims(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ended := f.orphanShims
	f.orphanShims = nil
	f.removedWhenShimsEnded = slices.Clone(f.removed)
	return ended, f.orphanErr
}

func (f *fakeBroker) RemoveJobContainer(id string) {
	f.mu.Lock()
	f.removed = append(f.removed, id)
	f.mu.Unlock()
}

type fixture struct {
	srv  *Server
	http *httptest.Server
	fb   *fakeBroker
	jr   *journal.Journal
	keys sandbox.KeySet
}

var testImage = "sha256:" + strings.Repeat("b", 64)

func newFixture(t *testing.T, mod func(*Config), before func(*journal.Journal)) *fixture {
	t.Helper()
	dir := t.TempDir()
	jr, err := journal.Open(filepath.Join(dir, "journal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jr.Close() })
	if before != nil {
		before(jr)
	}
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	fb := newFake()
	cfg := Default()
	cfg.Broker, cfg.Blobs, cfg.Journal, cfg.Signer = fb, blobs, jr, signer
	cfg.MaxBlobBytes = 4096
	cfg.ReapGrace, cfg.ReapInterval = time.Hour, time.Hour
	cfg.Preflight = func(_ context.Context, j sandbox.Job) error {
		if j.Image != testImage {
			return fmt.Errorf("job.image: image %s: %w: not present in the engine", j.Image, sandbox.ErrImageRefused)
		}
		return nil
	}
	if mod != nil {
		mod(&cfg)
	}
	fb = cfg.Broker.(interface{ fake() *fakeBroker }).fake()
	signer = cfg.Signer
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
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
	keys, err := sandbox.ParseKeySet(signer.PublicKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{srv: srv, http: hs, fb: fb, jr: jr, keys: keys}
}

func newJob(t *testing.T, id string, argv ...string) sandbox.Job {
	t.Helper()
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: id, Image: testImage, Argv: argv, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

func (f *fixture) do(t *testing.T, method, path string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func (f *fixture) submit(t *testing.T, j sandbox.Job) (int, sandbox.JobView, http.Header) {
	t.Helper()
	body, _ := json.Marshal(j)
	resp, b := f.do(t, "POST", "/v1/jobs", body)
	var v sandbox.JobView
	if resp.StatusCode < 300 {
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode, v, resp.Header
}

func (f *fixture) wait(t *testing.T, id string) sandbox.JobView {
	t.Helper()
	for range 50 {
		resp, b := f.do(t, "GET", "/v1/jobs/"+id+"/wait?timeout=2s", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("wait %s: got %d %s, want 200", id, resp.StatusCode, b)
		}
		var v sandbox.JobView
		json.Unmarshal(b, &v)
		if v.State.Terminal() {
			return v
		}
	}
	t.Fatalf("job %s did not end", id)
	return sandbox.JobView{}
}

func TestSubmitIsIdempotentByID(t *testing.T) {
	f := newFixture(t, nil, nil)
	j := newJob(t, "idem-1", "true")
	code, v1, _ := f.submit(t, j)
	if code != http.StatusAccepted {
		t.Fatalf("first submit: got %d, want 202", code)
	}
	if _, err := sandbox.VerifyReceipt(f.keys, v1.Receipt, j); err != nil {
		t.Fatalf("receipt does not verify: %v", err)
	}
	done := f.wait(t, j.ID)
	if _, err := sandbox.VerifyResult(f.keys, done.Result, j, done.Receipt); err != nil {
		t.Fatalf("result does not verify: %v", err)
	}
	code, v2, _ := f.submit(t, j)
	if code != http.StatusOK {
		t.Errorf("resubmit: got %d, want 200", code)
	}
	if !bytes.Equal(v1.Receipt, v2.Receipt) || !bytes.Equal(done.Result, v2.Result) {
		t.Errorf("resubmit: receipt or result bytes differ")
	}
	other := newJob(t, "idem-1", "false")
	code, _, _ = f.submit(t, other)
	if code != http.StatusConflict {
		t.Errorf("other digest: got %d, want 409", code)
	}
	if got := f.fb.runs["idem-1"]; got != 1 {
		t.Errorf("job ran %d times, want 1", got)
	}
}

func TestRefusedSubmissionsChangeNothing(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxJobBytes = 2048 }, nil)
	good := newJob(t, "good", "true")
	goodJSON, _ := json.Marshal(good)
	var unknown map[string]any
	json.Unmarshal(goodJSON, &unknown)
	unknown["extra"] = 1
	unknownJSON, _ := json.Marshal(unknown)
	noImage := newJob(t, "noimg", "true")
	noImage.Image = "sha256:" + strings.Repeat("c", 64)
	noImage.Seal()
	noImageJSON, _ := json.Marshal(noImage)
	tampered := bytes.Replace(goodJSON, []byte(`"true"`), []byte(`"false"`), 1)
	// Sealed as a client could seal it without validating: its digest
	// matches, only its file_count is over what a signed result can list.
	manyFiles := newJob(t, "many-files", "true")
	manyFiles.Limits.FileCount = sandbox.MaxFileCount + 1
	manyFiles.Digest = ""
	var err error
	if manyFiles.Digest, err = sandbox.SealedDigest(&manyFiles); err != nil {
		t.Fatal(err)
	}
	manyFilesJSON, _ := json.Marshal(manyFiles)
	blob := []byte("hello")
	tests := []struct {
		name, method, path string
		body               []byte
		code               int
		want               string
	}{
		{"malformed json", "POST", "/v1/jobs", []byte(`{"schema":`), 400, "unexpected EOF"},
		{"unknown field", "POST", "/v1/jobs", unknownJSON, 400, `unknown field "extra"`},
		{"oversize body", "POST", "/v1/jobs", bytes.Repeat([]byte(" "), 4096), 413, "larger than 2048 bytes"},
		{"digest does not match", "POST", "/v1/jobs", tampered, 400, "job.digest"},
		{"file_count over the result's bound", "POST", "/v1/jobs", manyFilesJSON, 400, fmt.Sprintf("job.limits.file_count: %d is out of range [0, %d]", sandbox.MaxFileCount+1, sandbox.MaxFileCount)},
		{"missing image", "POST", "/v1/jobs", noImageJSON, 422, "not present in the engine"},
		{"wrong blob digest claim", "PUT", "/v1/blobs/" + sandbox.DigestBytes([]byte("other")), blob, 400, "digest mismatch"},
		{"malformed blob digest", "PUT", "/v1/blobs/sha256:xyz", blob, 400, "sha256:<64 lowercase hex>"},
		{"oversize blob", "PUT", "/v1/blobs/" + sandbox.DigestBytes(make([]byte, 5000)), make([]byte, 5000), 413, "larger than 4096"},
		{"unknown job", "GET", "/v1/jobs/nope", nil, 404, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := f.do(t, tc.method, tc.path, tc.body)
			if resp.StatusCode != tc.code {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, b, tc.code)
			}
			var e ErrorBody
			if err := json.Unmarshal(b, &e); err != nil || !strings.Contains(e.Error, tc.want) {
				t.Errorf("got error %q (%v), want it to contain %q", e.Error, err, tc.want)
			}
		})
	}
	recs, err := f.jr.List()
	if err != nil || len(recs) != 0 {
		t.Errorf("journal holds %d records (%v), want 0", len(recs), err)
	}
}

func TestQueueFullAnswers429AndDropsNothing(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Concurrency, c.QueueSize = 1, 1 }, nil)
	gate := make(chan struct{})
	var jobs []sandbox.Job
	for i := range 3 {
		j := newJob(t, fmt.Sprintf("q-%d", i), "true")
		f.fb.gates[j.ID] = gate
		jobs = append(jobs, j)
	}
	if code, _, _ := f.submit(t, jobs[0]); code != 202 {
		t.Fatalf("first: got %d, want 202", code)
	}
	// Wait until the first one holds the only slot.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, _ := f.jr.Get(jobs[0].ID)
		if rec.State == journal.Started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first job never started (state %s)", rec.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _, _ := f.submit(t, jobs[1]); code != 202 {
		t.Fatalf("second: got %d, want 202", code)
	}
	code, _, hdr := f.submit(t, jobs[2])
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("third: got %d Retry-After %q, want 429 with Retry-After", code, hdr.Get("Retry-After"))
	}
	if _, err := f.jr.Get(jobs[2].ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("refused job is in the journal: %v", err)
	}
	close(gate)
	for _, j := range jobs[:2] {
		if v := f.wait(t, j.ID); v.Status != sandbox.StatusSucceeded {
			t.Errorf("%s: got %s, want succeeded", j.ID, v.Status)
		}
	}
}

func TestRecoveryNeverRunsTwice(t *testing.T) {
	signer, _ := receipt.NewEphemeralSigner()
	at := time.Now().Add(-time.Minute)
	jobs := map[string]sandbox.Job{}
	seed := func(jr *journal.Journal) {
		for _, id := range []string{"r-accepted", "r-requeued", "r-dispatched", "r-created", "r-started", "r-lost-id", "r-done"} {
			j := newJob(t, id, "true")
			jobs[id] = j
			canon, _ := j.CanonicalJSON()
			env, err := signer.SignAccepted(j, sandbox.RuntimeFacts{}, at)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := jr.Accept(j, canon, env, at); err != nil {
				t.Fatal(err)
			}
			switch id {
			case "r-accepted":
				continue
			case "r-done":
				jr.Finish(id, sandbox.StatusFailed, []byte("{}"), at)
				continue
			case "r-requeued":
				// An earlier restart proved it never ran, and the daemon
				// stopped again before it ran.
				jr.Dispatched(id)
				jr.NotRun(id)
				continue
			}
			jr.Dispatched(id)
			if id == "r-created" || id == "r-started" {
				jr.Created(id, "c-"+id)
			}
			if id == "r-started" {
				jr.Started(id, at)
			}
		}
	}
	fb := newFake()
	f := newFixture(t, func(c *Config) {
		// Only a container of r-lost-id (created, its id never journaled)
		// exists when the server starts.
		fb.existing = []broker.JobContainer{{ID: "c-lost", JobID: "r-lost-id", JobDigest: jobs["r-lost-id"].Digest}}
		c.Broker, c.Signer = fb, signer
	}, seed)
	want := map[string]sandbox.Status{
		"r-accepted":   sandbox.StatusSucceeded, // never dispatched: runs once now
		"r-requeued":   sandbox.StatusSucceeded, // proven unrun by an earlier restart: runs once now
		"r-dispatched": sandbox.StatusSucceeded, // no container bound: never ran, runs once now
		"r-created":    sandbox.StatusSucceeded, // recovered
		"r-started":    sandbox.StatusSucceeded, // recovered
		"r-lost-id":    sandbox.StatusSucceeded, // recovered from its label
		"r-done":       sandbox.StatusFailed,
	}
	deadline := time.Now().Add(10 * time.Second)
	for id, st := range want {
		for {
			rec, _ := f.jr.Get(id)
			if rec.State.Terminal() {
				if rec.Status != st {
					t.Errorf("%s: got %s, want %s", id, rec.Status, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not end (%s)", id, rec.State)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.runs["r-accepted"] != 1 || fb.runs["r-requeued"] != 1 || fb.runs["r-dispatched"] != 1 || len(fb.runs) != 3 {
		t.Errorf("got runs %v, want r-accepted, r-requeued and r-dispatched once each", fb.runs)
	}
	// A container of its name (unlabelled: a pooled sandbox taken) was
	// removed before it ran.
	if !slices.Contains(fb.removed, "name:r-dispatched") {
		t.Errorf("removed %v, want the container named after r-dispatched", fb.removed)
	}
	// Their runs may meet a create still in flight when a daemon was
	// killed: they may reclaim the name; a job never dispatched may not.
	slices.Sort(fb.reclaim)
	if !slices.Equal(fb.reclaim, []string{"r-dispatched", "r-requeued"}) {
		t.Errorf("runs that may reclaim the job's container name: %v, want r-dispatched's and r-requeued's", fb.reclaim)
	}
	wantRecovered := map[string]string{"r-created": "c-r-created", "r-started": "c-r-started", "r-lost-id": "c-lost"}
	for id, c := range wantRecovered {
		if fb.recovered[id] != c {
			t.Errorf("%s: recovered with %q, want %q", id, fb.recovered[id], c)
		}
	}
}

// A dispatched job whose container of its name cannot be removed is not
// run: it ends uncertain, naming the failed removal.
func TestRecoveryOfAnUnboundJobWhoseNameIsHeld(t *testing.T) {
	signer, _ := receipt.NewEphemeralSigner()
	at := time.Now().Add(-time.Minute)
	j := newJob(t, "r-held", "true")
	fb := newFake()
	fb.removeUnboundErr = errors.New("engine busy")
	f := newFixture(t, func(c *Config) { c.Broker, c.Signer = fb, signer }, func(jr *journal.Journal) {
		canon, _ := j.CanonicalJSON()
		env, _ := signer.SignAccepted(j, sandbox.RuntimeFacts{}, at)
		if _, _, err := jr.Accept(j, canon, env, at); err != nil {
			t.Fatal(err)
		}
		jr.Dispatched(j.ID)
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rec, _ := f.jr.Get(j.ID)
		if rec.State.Terminal() {
			if rec.Status != sandbox.StatusUncertain {
				t.Errorf("got %s, want uncertain", rec.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("did not end (%s)", rec.State)
		}
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.runs[j.ID] != 0 {
		t.Errorf("ran %d times with its name held", fb.runs[j.ID])
	}
}

func TestReapRemovesOnlyUnknownContainers(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ReapGrace = time.Minute }, nil)
	live := newJob(t, "live", "true")
	gate := make(chan struct{})
	defer close(gate)
	f.fb.gates[live.ID] = gate
	f.submit(t, live)
	old := time.Now().Add(-time.Hour)
	f.fb.mu.Lock()
	f.fb.existing = []broker.JobContainer{
		{ID: "c-live", JobID: "live", JobDigest: live.Digest, Created: old},
		{ID: "c-unknown", JobID: "stranger", JobDigest: live.Digest, Created: old},
		{ID: "c-young", JobID: "stranger2", JobDigest: live.Digest, Created: time.Now()},
		{ID: "c-other-process", JobID: "stranger3", JobDigest: live.Digest, Created: old, Deadline: time.Now().Add(time.Hour)},
	}
	f.fb.mu.Unlock()
	if err := f.srv.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.fb.mu.Lock()
	defer f.fb.mu.Unlock()
	if !slices.Equal(f.fb.removed, []string{"c-unknown"}) {
		t.Errorf("got removed %v, want [c-unknown]", f.fb.removed)
	}
}

// The reaper ends the engine's shims that serve no container once it has
// removed the containers it reaps (whose removal may leave one), and
// counts each; a sweep that fails is the reap's error, and a reap whose
// listing fails still sweeps.
func TestReapEndsOrphanedShims(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ReapGrace = time.Minute }, nil)
	f.fb.mu.Lock()
	f.fb.existing = []broker.JobContainer{{ID: "c-unknown", JobID: "stranger", JobDigest: testImage, Created: time.Now().Add(-time.Hour)}}
	f.fb.orphanShims = []string{"c-cut.0123abcd", "c-cut.4567ef01"}
	f.fb.mu.Unlock()
	if err := f.srv.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.fb.mu.Lock()
	if f.fb.orphanShims != nil || !slices.Equal(f.fb.removedWhenShimsEnded, []string{"c-unknown"}) {
		t.Errorf("shims left %v; removed before the sweep %v, want [c-unknown]", f.fb.orphanShims, f.fb.removedWhenShimsEnded)
	}
	f.fb.orphanErr = errors.New("proc unreadable")
	f.fb.mu.Unlock()
	var ended dto.Metric
	if err := f.srv.m.reconcile.WithLabelValues("shim_ended").Write(&ended); err != nil || ended.Counter.GetValue() != 2 {
		t.Errorf("shim_ended counted %v (%v), want 2", ended.Counter.GetValue(), err)
	}
	if err := f.srv.reap(context.Background()); err == nil || !strings.Contains(err.Error(), "proc unreadable") {
		t.Errorf("a failed sweep: reap returned %v", err)
	}
	f.fb.mu.Lock()
	f.fb.orphanErr, f.fb.orphanShims, f.fb.listErr = nil, []string{"c-cut.89abcdef"}, errors.New("engine gone")
	f.fb.mu.Unlock()
	if err := f.srv.reap(context.Background()); err == nil || !strings.Contains(err.Error(), "engine gone") {
		t.Errorf("a failed listing: reap returned %v", err)
	}
	f.fb.mu.Lock()
	defer f.fb.mu.Unlock()
	if f.fb.orphanShims != nil {
		t.Errorf("a reap whose listing failed left the shims %v", f.fb.orphanShims)
	}
}

// At start, before anything runs, the daemon removes what only a live
// process of its name uses: populate containers and selfcheck job
// containers (never journaled) an earlier, killed process left. A journaled
// job's container is recovered, never removed, whatever its id.
func TestStartRemovesAKilledProcesssSelfchecksAndPopulates(t *testing.T) {
	signer, _ := receipt.NewEphemeralSigner()
	var user sandbox.Job
	seed := func(jr *journal.Journal) {
		user = newJob(t, broker.SelfcheckJobPrefix+"user", "true") // a caller may name a job so
		canon, _ := user.CanonicalJSON()
		env, _ := signer.SignAccepted(user, sandbox.RuntimeFacts{}, time.Now())
		if _, _, err := jr.Accept(user, canon, env, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	fb := newFake()
	fb.populating = 2
	fb.existing = []broker.JobContainer{
		{ID: "c-selfcheck", JobID: broker.SelfcheckJobPrefix + "0a1b2c", JobDigest: testImage, Created: time.Now(), Deadline: time.Now().Add(time.Hour)},
		{ID: "c-stranger", JobID: "stranger", JobDigest: testImage, Created: time.Now(), Deadline: time.Now().Add(time.Hour)},
	}
	f := newFixture(t, func(c *Config) { c.Broker, c.Signer = fb, signer }, seed)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rec, _ := f.jr.Get(user.ID); rec.State.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the journaled job %s did not end", user.ID)
		}
	}
	f.fb.mu.Lock()
	defer f.fb.mu.Unlock()
	if !slices.Equal(f.fb.removed, []string{"c-selfcheck"}) || f.fb.populating != 0 {
		t.Errorf("removed %v and left %d populate containers, want [c-selfcheck] and none", f.fb.removed, f.fb.populating)
	}
	if got := f.fb.runs[user.ID]; got != 1 {
		t.Errorf("the journaled job %s ran %d times, want 1", user.ID, got)
	}
}

// A pooled sandbox of an earlier process carries no job label: the one an
// open journal record names is recovered with its journaled start and kept
// from the reaper; the others are reaped.
func TestStalePooledSandboxes(t *testing.T) {
	signer, _ := receipt.NewEphemeralSigner()
	started := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	var bound sandbox.Job
	seed := func(jr *journal.Journal) {
		bound = newJob(t, "pooled", "true")
		canon, _ := bound.CanonicalJSON()
		env, _ := signer.SignAccepted(bound, sandbox.RuntimeFacts{}, started)
		if _, _, err := jr.Accept(bound, canon, env, started); err != nil {
			t.Fatal(err)
		}
		jr.Dispatched(bound.ID)
		jr.Created(bound.ID, "c-pool-bound")
		jr.Started(bound.ID, started)
	}
	fb := newFake()
	old := time.Now().Add(-time.Hour)
	fb.stale = []broker.JobContainer{{ID: "c-pool-bound", Created: old}, {ID: "c-pool-idle", Created: old}, {ID: "c-pool-young", Created: time.Now()}}
	f := newFixture(t, func(c *Config) { c.Broker, c.Signer, c.ReapGrace = fb, signer, time.Minute }, seed)
	if v := f.wait(t, bound.ID); v.Status != sandbox.StatusSucceeded {
		t.Fatalf("bound job: %s", v.Status)
	}
	fb.mu.Lock()
	bind := fb.bindings[bound.ID]
	fb.mu.Unlock()
	if bind.ContainerID != "c-pool-bound" || !bind.StartedAt.Equal(started) {
		t.Fatalf("recovered with %+v, want c-pool-bound started at %v", bind, started)
	}
	if err := f.srv.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if !slices.Equal(fb.removed, []string{"c-pool-idle"}) {
		t.Errorf("got removed %v, want [c-pool-idle]", fb.removed)
	}
}

func TestMetricsCountJobs(t *testing.T) {
	f := newFixture(t, nil, nil)
	for i := range 5 {
		j := newJob(t, fmt.Sprintf("m-%d", i), "true")
		f.submit(t, j)
		f.submit(t, j) // an idempotent resubmit is not a second acceptance
		f.wait(t, j.ID)
	}
	resp, b := f.do(t, "GET", "/metrics", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("got %d, want 200", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	get := func(name string, label ...string) float64 {
		fam := fams[name]
		if fam == nil {
			t.Fatalf("no metric %s", name)
		}
		for _, m := range fam.Metric {
			ok := true
			for i := 0; i+1 < len(label); i += 2 {
				found := false
				for _, lp := range m.Label {
					found = found || (lp.GetName() == label[i] && lp.GetValue() == label[i+1])
				}
				ok = ok && found
			}
			if ok {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				if m.Histogram != nil {
					return float64(m.Histogram.GetSampleCount())
				}
				return m.Gauge.GetValue()
			}
		}
		t.Fatalf("no %s%v", name, label)
		return 0
	}
	checks := []struct {
		name  string
		label []string
		want  float64
	}{
		{"sandboxd_jobs_accepted_total", nil, 5},
		{"sandboxd_jobs_finished_total", []string{"status", "succeeded"}, 5},
		{"sandboxd_envelopes_signed_total", []string{"kind", "receipt"}, 5},
		{"sandboxd_envelopes_signed_total", []string{"kind", "result"}, 5},
		{"sandboxd_job_duration_seconds", nil, 5},
		{"sandboxd_container_create_seconds", nil, 5},
		{"sandboxd_queue_depth", nil, 0},
		{"sandboxd_jobs_running", nil, 0},
	}
	for _, c := range checks {
		if got := get(c.name, c.label...); got != c.want {
			t.Errorf("%s%v: got %v, want %v", c.name, c.label, got, c.want)
		}
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for p, ops := range doc.Paths {
		for m := range ops {
			documented = append(documented, strings.ToUpper(m)+" "+p)
		}
	}
	s := &Server{m: newMetrics()}
	for _, r := range s.routeTable() {
		served = append(served, r.method+" "+r.path)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("got documented routes\n%v\nwant the served routes\n%v", documented, served)
	}
}

// metricValue reads one unlabelled gauge or counter of the server.
func (f *fixture) metricValue(t *testing.T, name string) float64 {
	t.Helper()
	_, b := f.do(t, "GET", "/metrics", nil)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	fam := fams[name]
	if fam == nil || len(fam.Metric) != 1 {
		t.Fatalf("no single series %s", name)
	}
	if m := fam.Metric[0]; m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return fam.Metric[0].Counter.GetValue()
}

// Jobs a previous process left running hold concurrency slots from the
// moment recovery finds them: with every slot held by one, no queued job
// starts; as they end, the queued jobs start one slot at a time, in the
// order they were accepted.
func TestRecoveredJobsHoldConcurrencySlots(t *testing.T) {
	signer, _ := receipt.NewEphemeralSigner()
	at := time.Now().Add(-time.Minute)
	// In acceptance order, which is not the journal's key order, and
	// accepted at decreasing times (a clock stepped back): the queue's order
	// after a restart is the journal's Seq, not the clock's.
	queued := []string{"q-3", "q-1", "q-0", "q-2"}
	seed := func(jr *journal.Journal) {
		accept := func(id string, when time.Time) {
			j := newJob(t, id, "true")
			canon, _ := j.CanonicalJSON()
			env, err := signer.SignAccepted(j, sandbox.RuntimeFacts{}, when)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := jr.Accept(j, canon, env, when); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"r-0", "r-1"} {
			accept(id, at)
			jr.Dispatched(id)
			jr.Created(id, "c-"+id)
			jr.Started(id, at)
		}
		for i, id := range queued {
			accept(id, at.Add(-time.Duration(i+1)*time.Millisecond))
		}
	}
	fb := newFake()
	release := map[string]chan struct{}{"r-0": make(chan struct{}), "r-1": make(chan struct{})}
	fb.recoverGates = release
	freed := map[string]bool{}
	free := func(ids ...string) {
		for _, id := range ids {
			if !freed[id] {
				freed[id] = true
				close(release[id])
			}
		}
	}
	releaseAll := func() { free("r-0", "r-1") }
	f := newFixture(t, func(c *Config) { c.Broker, c.Signer, c.Concurrency = fb, signer, 2 }, seed)
	t.Cleanup(releaseAll) // before the fixture's Shutdown waits for them
	active := func() int {
		fb.mu.Lock()
		defer fb.mu.Unlock()
		return fb.active
	}
	for active() < 2 {
		runtime.Gosched()
	}
	// Both slots are held by recovered jobs. Give the workers every
	// chance to start a queued job anyway: none may.
	for range 50 {
		time.Sleep(time.Millisecond)
		runtime.Gosched()
	}
	fb.mu.Lock()
	ran := slices.Clone(fb.order)
	fb.mu.Unlock()
	if len(ran) != 0 {
		t.Fatalf("jobs %v started while both slots were held by recovered jobs", ran)
	}
	for _, c := range []struct {
		name string
		want float64
	}{{"sandboxd_jobs_recovering", 2}, {"sandboxd_jobs_running", 0}, {"sandboxd_queue_depth", 4}} {
		if got := f.metricValue(t, c.name); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}

	free("r-0")
	for _, id := range queued {
		if v := f.wait(t, id); v.Status != sandbox.StatusSucceeded {
			t.Errorf("%s: got %s, want succeeded", id, v.Status)
		}
	}
	if got := f.metricValue(t, "sandboxd_jobs_recovering"); got != 1 {
		t.Errorf("sandboxd_jobs_recovering with r-1 still held: got %v, want 1", got)
	}
	releaseAll()
	f.wait(t, "r-1")
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if !slices.Equal(fb.order, queued) {
		t.Errorf("queued jobs ran in order %v, want acceptance order %v", fb.order, queued)
	}
	if fb.maxActive > 2 {
		t.Errorf("got %d jobs running or recovered at once, want at most --concurrency 2", fb.maxActive)
	}
}
