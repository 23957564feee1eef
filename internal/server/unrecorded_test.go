package server

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox"
)

// failJournal replaces a journal call for the test.
func failJournal[F any](t *testing.T, fn *F, wrap func(orig F) F) {
	orig := *fn
	*fn = wrap(orig)
	t.Cleanup(func() { *fn = orig })
}

func fastRetries(t *testing.T) {
	first, most := retryFirst, retryMax
	retryFirst, retryMax = 5*time.Millisecond, 20*time.Millisecond
	t.Cleanup(func() { retryFirst, retryMax = first, most })
}

// refuseResult makes the journal refuse job id's result while the flag it
// returns (set) is.
func refuseResult(t *testing.T, jobID string) *atomic.Bool {
	var failing atomic.Bool
	failing.Store(true)
	failJournal(t, &finishRecord, func(orig func(*journal.Journal, string, sandbox.Status, []byte, time.Time) (journal.Record, error)) func(*journal.Journal, string, sandbox.Status, []byte, time.Time) (journal.Record, error) {
		return func(j *journal.Journal, id string, st sandbox.Status, env []byte, at time.Time) (journal.Record, error) {
			if id == jobID && failing.Load() {
				return journal.Record{}, errors.New("no space left on device (test)")
			}
			return orig(j, id, st, env, at)
		}
	})
	return &failing
}

func TestResultTheJournalRefusesIsRetriedAndWaitSaysWhy(t *testing.T) {
	fastRetries(t)
	failing := refuseResult(t, "u-1")
	f := newFixture(t, func(c *Config) { c.Broker.(*fakeBroker).finish = true }, nil)
	fb := f.fb
	j := newJob(t, "u-1", "true")
	if code, _, _ := f.submit(t, j); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	// While the journal refuses the result, a wait answers at once with
	// the cause, not with a job that seems to run forever.
	var body ErrorBody
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, b := f.do(t, "GET", "/v1/jobs/u-1/wait?timeout=1s", nil)
		if resp.StatusCode == 503 {
			json.Unmarshal(b, &body)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wait kept answering %d %s, want 503 result_not_recorded", resp.StatusCode, b)
		}
	}
	if body.Code != "result_not_recorded" || !strings.Contains(body.Error, "no space left on device (test)") {
		t.Errorf("got %+v, want code result_not_recorded naming the journal's error", body)
	}
	// Once the journal takes it, the job ends with the result it had, and
	// its container (kept meanwhile) is removed.
	failing.Store(false)
	var v sandbox.JobView
	for deadline := time.Now().Add(10 * time.Second); !v.State.Terminal(); {
		resp, b := f.do(t, "GET", "/v1/jobs/u-1/wait?timeout=1s", nil)
		if resp.StatusCode == 200 {
			json.Unmarshal(b, &v)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not end once the journal took its result: %d %s", resp.StatusCode, b)
		}
	}
	if v.Status != sandbox.StatusSucceeded {
		t.Errorf("got %s, want succeeded", v.Status)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		fb.mu.Lock()
		removed := slices.Contains(fb.removed, "c-u-1")
		fb.mu.Unlock()
		if removed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kept container was not removed once the result was recorded")
		}
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.runs["u-1"] != 1 {
		t.Errorf("got %d runs, want 1", fb.runs["u-1"])
	}
}

// While a result the journal refused is retried, nothing durable names its
// artifacts and logs and the broker's hold is gone: the retry pins them, so
// no GC removes them as orphans, until the journal takes the result.
func TestResultRetriedKeepsItsOutputsPinned(t *testing.T) {
	fastRetries(t)
	failing := refuseResult(t, "u-2")
	f := newFixture(t, func(c *Config) { fb := c.Broker.(*fakeBroker); fb.finish, fb.outputs = true, true }, nil)
	blobs := f.srv.cfg.Blobs
	if code, _, _ := f.submit(t, newJob(t, "u-2", "true")); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, b := f.do(t, "GET", "/v1/jobs/u-2/wait?timeout=1s", nil)
		if resp.StatusCode == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wait kept answering %d %s, want 503 result_not_recorded", resp.StatusCode, b)
		}
	}
	for _, d := range []string{fakeArtifact("u-2"), fakeStdout("u-2")} {
		if !blobs.Pinned(d) {
			t.Errorf("while the result is retried, output %s is not pinned: a GC may remove it as an orphan", d)
		}
	}
	failing.Store(false)
	for deadline := time.Now().Add(10 * time.Second); blobs.Pinned(fakeArtifact("u-2")) || blobs.Pinned(fakeStdout("u-2")); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the outputs stay pinned after the journal took the result")
		}
	}
	if rec, err := f.jr.Get("u-2"); err != nil || len(rec.Result) == 0 {
		t.Fatalf("the outputs were unpinned before the result was recorded (state %s, %v)", rec.State, err)
	}
}

func TestShutdownReportsResultsNotRecorded(t *testing.T) {
	fastRetries(t)
	failJournal(t, &finishRecord, func(orig func(*journal.Journal, string, sandbox.Status, []byte, time.Time) (journal.Record, error)) func(*journal.Journal, string, sandbox.Status, []byte, time.Time) (journal.Record, error) {
		return func(j *journal.Journal, id string, st sandbox.Status, env []byte, at time.Time) (journal.Record, error) {
			if id == "u-2" {
				return journal.Record{}, errors.New("journal broken (test)")
			}
			return orig(j, id, st, env, at)
		}
	})
	f := newFixture(t, func(c *Config) { c.Broker.(*fakeBroker).finish = true }, nil)
	fb := f.fb
	f.submit(t, newJob(t, "u-2", "true"))
	for deadline := time.Now().Add(10 * time.Second); f.srv.pending.get("u-2") == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the refused result was never pending")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.srv.Shutdown(ctx)
	if err == nil || !strings.Contains(err.Error(), "u-2") || !strings.Contains(err.Error(), "next start recovers") {
		t.Errorf("shutdown: got %v, want an error naming u-2 and its recovery", err)
	}
	rec, _ := f.jr.Get("u-2")
	if rec.State != journal.Started || rec.ContainerID != "c-u-2" {
		t.Errorf("journal: got %s with container %q, want started with c-u-2 (recovered at the next start)", rec.State, rec.ContainerID)
	}
	fb.mu.Lock()
	if slices.Contains(fb.removed, "c-u-2") {
		t.Error("the container of an unrecorded result was removed")
	}
	fb.mu.Unlock()
	f.srv.pending.clear("u-2") // the fixture's own shutdown then succeeds
}

func TestDispatchTheJournalRefusesIsRetried(t *testing.T) {
	fastRetries(t)
	var refusals atomic.Int32
	failJournal(t, &dispatchRecord, func(orig func(*journal.Journal, string) (journal.Record, error)) func(*journal.Journal, string) (journal.Record, error) {
		return func(j *journal.Journal, id string) (journal.Record, error) {
			if id == "d-1" && refusals.Add(1) <= 3 {
				return journal.Record{}, errors.New("database busy (test)")
			}
			return orig(j, id)
		}
	})
	f := newFixture(t, nil, nil)
	f.submit(t, newJob(t, "d-1", "true"))
	if v := f.wait(t, "d-1"); v.Status != sandbox.StatusSucceeded {
		t.Errorf("got %s, want succeeded", v.Status)
	}
	f.fb.mu.Lock()
	defer f.fb.mu.Unlock()
	if f.fb.runs["d-1"] != 1 || refusals.Load() != 4 {
		t.Errorf("got %d runs after %d dispatch attempts, want 1 run after 4", f.fb.runs["d-1"], refusals.Load())
	}
}
