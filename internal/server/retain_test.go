package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// With Retain, a collection removes the records of jobs that ended
// before it, and then the blobs only they named; a record that ended
// since, a job that has not ended, and their blobs stay. The metrics
// say how many records the journal holds.
func TestRetentionRemovesOldRecordsOnly(t *testing.T) {
	oldOut, youngOut := sandbox.DigestBytes([]byte("old output")), sandbox.DigestBytes([]byte("young output"))
	envelope := func(d string) []byte {
		b, _ := json.Marshal(sandbox.Envelope{PayloadType: "application/vnd.in-toto+json",
			Payload: base64.StdEncoding.EncodeToString([]byte(`{"stdout":{"digest":"` + d + `"}}`))})
		return b
	}
	now := time.Now()
	f := newFixture(t, func(c *Config) { c.Retain, c.GCMinAge = time.Hour, 0 }, func(jr *journal.Journal) {
		for _, r := range []struct {
			id    string
			ended time.Time
			out   string
		}{{"old", now.Add(-2 * time.Hour), oldOut}, {"young", now.Add(-50 * time.Minute), youngOut}} {
			j := newJob(t, r.id, "true")
			canon, _ := j.CanonicalJSON()
			if _, _, err := jr.Accept(j, canon, []byte("receipt"), r.ended.Add(-time.Minute)); err != nil {
				t.Fatal(err)
			}
			if _, err := jr.Finish(r.id, sandbox.StatusSucceeded, envelope(r.out), r.ended); err != nil {
				t.Fatal(err)
			}
		}
	})
	gate := make(chan struct{})
	defer close(gate)
	f.fb.mu.Lock()
	f.fb.gates["live"] = gate
	f.fb.mu.Unlock()
	if code, _, _ := f.submit(t, newJob(t, "live", "true")); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	for _, b := range []string{"old output", "young output"} {
		if _, err := f.srv.cfg.Blobs.PutBytes([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	if resp, b := f.do(t, "POST", "/v1/gc", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("gc: %d %s", resp.StatusCode, b)
	}
	if _, err := f.jr.Get("old"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the record that ended 2h ago: got %v, want it removed", err)
	}
	for _, id := range []string{"young", "live"} {
		if _, err := f.jr.Get(id); err != nil {
			t.Errorf("record %s: %v, want it kept", id, err)
		}
	}
	if f.srv.cfg.Blobs.Has(oldOut) {
		t.Errorf("the removed record's output is still stored")
	}
	if !f.srv.cfg.Blobs.Has(youngOut) {
		t.Errorf("the kept record's output was removed")
	}
	if got := f.metricValue(t, "sandboxd_journal_records"); got != 2 {
		t.Errorf("sandboxd_journal_records: got %v, want 2", got)
	}
	if got := f.metricValue(t, "sandboxd_journal_records_removed_total"); got != 1 {
		t.Errorf("sandboxd_journal_records_removed_total: got %v, want 1", got)
	}
}

// With Retain, the collections that remove old records remove the
// assessments (and signed forms) retained before the retention too, by
// when each was retained; a younger one, and a writer's temporary file,
// stay. The metrics say how many the store holds and how many went.
// Without Retain every assessment stays.
func TestRetentionRemovesOldAssessmentsOnly(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		retain    time.Duration
		wantGone  []string
		wantKept  []string
		wantTotal float64
	}{
		{"retain 1h", time.Hour, []string{"old"}, []string{"young", "new"}, 1},
		{"no retention", 0, nil, []string{"old", "young", "new"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			assessments, err := supervisor.NewDirStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			keys := map[string]string{}
			for name, age := range map[string]time.Duration{"old": 2 * time.Hour, "young": 50 * time.Minute, "new": 0} {
				keys[name] = sandbox.DigestBytes([]byte(name))
				if _, err := assessments.Retain(ctx, keys[name], []byte(`{"assessment":"`+name+`"}`)); err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(dir, strings.TrimPrefix(keys[name], "sha256:")+".json")
				if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
					t.Fatal(err)
				}
			}
			tmp := filepath.Join(dir, ".tmp-1234")
			if err := os.WriteFile(tmp, []byte("being written"), 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(tmp, now.Add(-3*time.Hour), now.Add(-3*time.Hour))
			f := newFixture(t, func(c *Config) { c.Retain, c.Supervisor = tc.retain, supervisor.New(assessments) }, nil)
			if resp, b := f.do(t, "POST", "/v1/gc", nil); resp.StatusCode != http.StatusOK {
				t.Fatalf("gc: %d %s", resp.StatusCode, b)
			}
			for _, name := range tc.wantGone {
				if _, err := assessments.Load(ctx, keys[name]); !errors.Is(err, sandbox.ErrNotFound) {
					t.Errorf("the %s assessment: got %v, want it removed", name, err)
				}
			}
			for _, name := range tc.wantKept {
				if _, err := assessments.Load(ctx, keys[name]); err != nil {
					t.Errorf("the %s assessment: %v, want it kept", name, err)
				}
			}
			if _, err := os.Stat(tmp); err != nil {
				t.Errorf("a writer's temporary file: %v, want it left alone", err)
			}
			if got := f.metricValue(t, "sandboxd_assessments_retained"); got != float64(len(tc.wantKept)) {
				t.Errorf("sandboxd_assessments_retained: got %v, want %d", got, len(tc.wantKept))
			}
			if got := f.metricValue(t, "sandboxd_assessments_removed_total"); got != tc.wantTotal {
				t.Errorf("sandboxd_assessments_removed_total: got %v, want %v", got, tc.wantTotal)
			}
		})
	}
}
