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
