package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// A collection beyond the blob budget never removes what a queued or
// running job needs; once the job ended, its input may go.
func TestGCSparesWhatJobsNeed(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BlobBudget, c.GCMinAge = 1, 0 }, nil)
	input := bytes.Repeat([]byte("i"), 3000)
	d := blobOf(input)
	if resp, b := f.do(t, "PUT", "/v1/blobs/"+d, input); resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	gate := make(chan struct{})
	f.fb.mu.Lock()
	f.fb.gates["g-1"] = gate
	f.fb.mu.Unlock()
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: "g-1", Image: testImage, Argv: []string{"true"}, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
		Inputs: []sandbox.Input{{Name: "a", Digest: d, Path: "/inputs/a"}}}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := f.submit(t, j); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	gc := func() GCReport {
		resp, b := f.do(t, "POST", "/v1/gc", nil)
		var rep GCReport
		if resp.StatusCode != 200 || json.Unmarshal(b, &rep) != nil {
			t.Fatalf("gc: %d %s", resp.StatusCode, b)
		}
		return rep
	}
	if rep := gc(); !f.srv.cfg.Blobs.Has(d) || rep.Blobs.Bytes != int64(len(input)) {
		t.Fatalf("a running job's input: held %v, report %+v; want it kept over the budget", f.srv.cfg.Blobs.Has(d), rep)
	}
	close(gate)
	f.wait(t, "g-1")
	rep := gc()
	if f.srv.cfg.Blobs.Has(d) || rep.Blobs.Evicted != 1 || rep.Blobs.EvictedBytes != int64(len(input)) || rep.Blobs.Bytes != 0 {
		t.Errorf("an ended job's input: held %v, report %+v; want it evicted", f.srv.cfg.Blobs.Has(d), rep)
	}
}
