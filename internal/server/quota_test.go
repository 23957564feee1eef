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

// TestTenantBlobBytesQuota: max_blob_bytes bounds the stored blobs a
// tenant holds, its uploads and its jobs' outputs, each counted once
// whatever the jobs that name it: an upload beyond it, and a submission
// once the tenant holds it all, get 507 naming it; another tenant's room
// is its own; an idempotent resubmission is answered anyway.
func TestTenantBlobBytesQuota(t *testing.T) {
	r := newTenancyRig(t, `, "quota": {"max_blob_bytes": 100}`, nil)
	r.f.fb.outputs = true
	x, z, w := bytes.Repeat([]byte("x"), 60), bytes.Repeat([]byte("z"), 30), bytes.Repeat([]byte("w"), 20)
	put := func(c *http.Client, b []byte) (int, ErrorBody) {
		t.Helper()
		code, body := r.do(t, c, "PUT", "/v1/blobs/"+blobOf(b), b)
		var e ErrorBody
		json.Unmarshal(body, &e)
		return code, e
	}
	if code, e := put(r.a, x); code != http.StatusCreated {
		t.Fatalf("A's first upload: got %d %+v, want 201", code, e)
	}
	// The same blob again is held once.
	if code, e := put(r.a, x); code != http.StatusOK {
		t.Fatalf("A's upload of the same blob: got %d %+v, want 200", code, e)
	}
	if code, e := put(r.a, z); code != http.StatusCreated {
		t.Fatalf("A's upload to 90 bytes held: got %d %+v, want 201", code, e)
	}
	code, e := put(r.a, w)
	if code != http.StatusInsufficientStorage || e.Code != "quota_exceeded" ||
		!strings.Contains(e.Error, `tenant "tenant-a" holds 90 bytes of stored blobs`) || !strings.Contains(e.Error, "its quota max_blob_bytes 100") {
		t.Fatalf("A's upload beyond max_blob_bytes: got %d %+v, want 507 naming the quota", code, e)
	}
	if r.f.srv.cfg.Blobs.Has(blobOf(w)) {
		t.Error("the refused upload was stored")
	}
	if code, e := put(r.b, w); code != http.StatusCreated {
		t.Errorf("B's upload: got %d %+v, want 201 (A's quota is A's)", code, e)
	}
	// A job naming an upload does not free its bytes (it is still held);
	// the job's outputs add to them.
	if code, b := r.submit(t, r.a, newJobWithInput(t, "a-1", blobOf(x))); code != http.StatusAccepted {
		t.Fatalf("A's job at 90 bytes held: got %d %s, want 202", code, b)
	}
	if code, b := r.do(t, r.a, "GET", "/v1/jobs/a-1/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"state":"finished"`)) {
		t.Fatalf("A's job: got %d %s", code, b)
	}
	// The fake writes no blobs: the artifact its result names is stored here.
	if d, err := r.f.srv.cfg.Blobs.PutBytes([]byte("artifact of a-1")); err != nil || d != fakeArtifact("a-1") {
		t.Fatalf("store the artifact: %v %s", err, d)
	}
	code, b := r.submit(t, r.a, newJob(t, "a-2", "true"))
	if code != http.StatusInsufficientStorage || !strings.Contains(string(b), `tenant \"tenant-a\" holds 105 bytes of stored blobs`) ||
		!strings.Contains(string(b), "its quota max_blob_bytes is 100") || !strings.Contains(string(b), `"code":"quota_exceeded"`) {
		t.Errorf("A's job at 105 bytes held: got %d %s, want 507 naming the quota", code, b)
	}
	if code, b := r.submit(t, r.a, newJobWithInput(t, "a-1", blobOf(x))); code != http.StatusOK {
		t.Errorf("A resubmits its job: got %d %s, want 200", code, b)
	}
	if code, b := r.submit(t, r.b, newJob(t, "b-1", "true")); code != http.StatusAccepted {
		t.Errorf("B's job: got %d %s, want 202", code, b)
	}
}

// TestTenantLeaseOfItsOwnBlobCountsAgainstItsUploadQuota: an empty PUT
// of a blob the tenant stored leases it, making it an upload no accepted
// job names yet again: a new lease beyond the tenant's max_upload_bytes
// is refused 507 naming it, though the daemon's quota has room; renewing
// a lease the quota counts already takes nothing.
func TestTenantLeaseOfItsOwnBlobCountsAgainstItsUploadQuota(t *testing.T) {
	r := newTenancyRig(t, `, "quota": {"max_upload_bytes": 100}`, nil)
	x, y := bytes.Repeat([]byte("x"), 60), bytes.Repeat([]byte("y"), 60)
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+blobOf(x), x); code != http.StatusCreated {
		t.Fatalf("A uploads x: got %d %s", code, b)
	}
	// A job naming x takes it off the quota (its lease is dropped).
	if code, b := r.submit(t, r.a, newJobWithInput(t, "a-x", blobOf(x))); code != http.StatusAccepted {
		t.Fatalf("A's job naming x: got %d %s", code, b)
	}
	if code, b := r.do(t, r.a, "GET", "/v1/jobs/a-x/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"state":"finished"`)) {
		t.Fatalf("A's job: got %d %s", code, b)
	}
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+blobOf(y), y); code != http.StatusCreated {
		t.Fatalf("A uploads y: got %d %s", code, b)
	}
	code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+blobOf(x), nil)
	var e ErrorBody
	json.Unmarshal(b, &e)
	if code != http.StatusInsufficientStorage || e.Code != "quota_exceeded" || !strings.Contains(e.Error, "a lease of this stored 60-byte blob counts as an upload") ||
		!strings.Contains(e.Error, `tenant "tenant-a"'s uploads no accepted job names yet hold 60 bytes`) || !strings.Contains(e.Error, "its quota max_upload_bytes 100") {
		t.Fatalf("A's empty PUT of x beyond its quota: got %d %s, want 507 naming max_upload_bytes", code, b)
	}
	if r.f.srv.cfg.Blobs.Leased(blobOf(x), r.f.srv.cfg.BlobLeaseTTL) {
		t.Error("the refused lease was taken")
	}
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+blobOf(y), nil); code != http.StatusOK {
		t.Errorf("A renews the lease of y: got %d %s, want 200", code, b)
	}
	// The admin, without a quota, leases it.
	if code, b := r.do(t, r.admin, "PUT", "/v1/blobs/"+blobOf(x), nil); code != http.StatusOK {
		t.Errorf("the admin's empty PUT of x: got %d %s, want 200", code, b)
	}
}
