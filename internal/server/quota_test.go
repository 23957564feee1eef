package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

func blobOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Uploads no accepted job names are bounded together, not only one by
// one; accepting a job that names them frees their room.
func TestUploadsHaveATotalQuota(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBlobBytes, c.MaxUploadBytes = 4096, 8192 }, nil)
	blobs := make([][]byte, 3)
	for i := range blobs {
		blobs[i] = bytes.Repeat([]byte{'a' + byte(i)}, 4000)
	}
	put := func(b []byte) (int, ErrorBody) {
		resp, body := f.do(t, "PUT", "/v1/blobs/"+blobOf(b), b)
		var e ErrorBody
		json.Unmarshal(body, &e)
		return resp.StatusCode, e
	}
	for _, b := range blobs[:2] {
		if code, e := put(b); code != http.StatusCreated {
			t.Fatalf("upload within the quota: got %d %+v", code, e)
		}
	}
	code, e := put(blobs[2])
	if code != http.StatusInsufficientStorage || e.Code != "insufficient_storage" || !strings.Contains(e.Error, "--max-upload-bytes") {
		t.Fatalf("upload over the quota: got %d %+v, want 507 naming --max-upload-bytes", code, e)
	}
	if f.srv.cfg.Blobs.Has(blobOf(blobs[2])) {
		t.Error("the refused upload was stored")
	}
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: "q-1", Image: testImage, Argv: []string{"true"}, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
		Inputs: []sandbox.Input{{Name: "a", Digest: blobOf(blobs[0]), Path: "/inputs/a"}, {Name: "b", Digest: blobOf(blobs[1]), Path: "/inputs/b"}}}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := f.submit(t, j); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	if code, e := put(blobs[2]); code != http.StatusCreated {
		t.Errorf("upload after a job took the others: got %d %+v, want 201", code, e)
	}
}

// A PUT of a blob the store holds already (with or without a body) leases
// it, and the lease keeps it from every sweep: a new lease takes the
// blob's size of the quota as an upload does, and is refused as one when
// the room is not there; renewing a lease takes nothing more.
func TestLeasingAStoredBlobCountsAgainstTheQuota(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBlobBytes, c.MaxUploadBytes = 4096, 8192 }, nil)
	// Two blobs the daemon holds that no lease holds (a finished job's
	// artifacts, or inputs of an accepted job).
	stored := make([]string, 2)
	for i := range stored {
		d, err := f.srv.cfg.Blobs.PutBytes(bytes.Repeat([]byte{'s' + byte(i)}, 4000))
		if err != nil {
			t.Fatal(err)
		}
		stored[i] = d
	}
	put := func(d string, b []byte) (int, ErrorBody) {
		resp, body := f.do(t, "PUT", "/v1/blobs/"+d, b)
		var e ErrorBody
		json.Unmarshal(body, &e)
		return resp.StatusCode, e
	}
	if code, e := put(stored[0], nil); code != http.StatusOK {
		t.Fatalf("lease of a stored blob within the quota: got %d %+v, want 200", code, e)
	}
	small := bytes.Repeat([]byte{'u'}, 300)
	if code, e := put(blobOf(small), small); code != http.StatusCreated {
		t.Fatalf("upload within the quota: got %d %+v, want 201", code, e)
	}
	code, e := put(stored[1], nil)
	if code != http.StatusInsufficientStorage || e.Code != "insufficient_storage" || !strings.Contains(e.Error, "--max-upload-bytes") {
		t.Fatalf("lease of a stored blob beyond the quota: got %d %+v, want 507 naming --max-upload-bytes", code, e)
	}
	if n, _ := f.srv.cfg.Blobs.LeasedBytes(f.srv.cfg.BlobLeaseTTL); n != 4300 {
		t.Errorf("leased bytes after the refusal: got %d, want 4300", n)
	}
	// Renewing the leases the quota counts already takes no more room,
	// full or not.
	more := bytes.Repeat([]byte{'v'}, 3800)
	if code, e := put(blobOf(more), more); code != http.StatusCreated {
		t.Fatalf("upload filling the quota: got %d %+v, want 201", code, e)
	}
	for _, d := range []string{stored[0], blobOf(small), blobOf(more)} {
		if code, e := put(d, nil); code != http.StatusOK {
			t.Errorf("renewing the lease of %s: got %d %+v, want 200", d, code, e)
		}
	}
	if n, _ := f.srv.cfg.Blobs.LeasedBytes(f.srv.cfg.BlobLeaseTTL); n != 8100 {
		t.Errorf("leased bytes after renewals: got %d, want 8100", n)
	}
}
