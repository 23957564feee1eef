package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// exampleBundle packs the test bundle and returns it with a reader of its
// blobs (the manifest's and bundle.json's bytes, as a client sends them).
func exampleBundle(t *testing.T) (*bundle.Bundle, func(digest string) []byte) {
	t.Helper()
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	return b, func(d string) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
}

// assessFixture is a daemon with a supervisor (assessments retained in a
// directory) whose broker runs any image.
func assessFixture(t *testing.T) *fixture {
	t.Helper()
	assessments, err := supervisor.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return newFixture(t, func(c *Config) {
		c.Preflight = func(context.Context, sandbox.Job) error { return nil }
		c.Supervisor = supervisor.New(assessments)
	}, nil)
}

// The plan endpoint answers exactly the jobs the assess endpoint judges,
// and a verifier that builds the grader job with the public
// sandbox.GraderJob and sandbox.WriteCandidateExport gets the job and
// export digest the daemon rebuilds.
func TestPlanIsTheBundlesJobs(t *testing.T) {
	ctx := context.Background()
	b, blob := exampleBundle(t)
	f := newFixture(t, nil, nil)
	ws := sandbox.DigestBytes([]byte("workspace"))
	ask := func(req sandbox.PlanRequest) (int, []byte) {
		body, _ := json.Marshal(req)
		resp, out := f.do(t, http.MethodPost, "/v1/plan", body)
		return resp.StatusCode, out
	}
	code, out := ask(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1"})
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, out)
	}
	var p sandbox.Plan
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	if p.ManifestDigest != b.Digest || p.LayerDigest != b.LayerDigest || p.Image != b.Manifest.Image || strings.Join(p.RequiredChecks, ",") != strings.Join(b.Manifest.RequiredChecks, ",") {
		t.Fatalf("plan %+v does not bind the bundle", p)
	}
	if b.Manifest.Candidate == nil {
		t.Fatal("the test bundle has no candidate command; this test expects one")
	}
	wantC := evalOf(t, b.Manifest, b.Digest, "", "").CandidateJob(ws, "c1")
	if err := wantC.Seal(); err != nil {
		t.Fatal(err)
	}
	if p.Candidate == nil || p.Candidate.Digest != wantC.Digest {
		t.Fatalf("plan candidate %+v, want the bundle's candidate job %s", p.Candidate, wantC.Digest)
	}
	// Without a candidate command the grader is the complete job on the
	// workspace itself.
	m := b.Manifest
	m.Candidate = nil
	np, err := evalOf(t, m, b.Digest, b.LayerDigest, "").Plan(ws, "c1", "g1")
	if err != nil {
		t.Fatal(err)
	}
	want := evalOf(t, m, b.Digest, b.LayerDigest, "").GraderJob(ws, "g1")
	if err := want.Seal(); err != nil {
		t.Fatal(err)
	}
	if np.Candidate != nil || np.Grader.Digest != want.Digest {
		t.Fatalf("plan grader %s, want the bundle's grader job on the workspace %s", np.Grader.Digest, want.Digest)
	}

	// The template the public builder completes into the daemon's own
	// grader job.
	m = b.Manifest
	tp := p
	arts := map[string][]byte{"/work/export/a.txt": []byte("a\n"), "/work/export/sub/dir/b.txt": []byte("bee\n"), "/work/other.txt": []byte("not exported")}
	res := sandbox.Result{Schema: sandbox.ResultSchema, JobID: tp.Candidate.ID, JobDigest: tp.Candidate.Digest, Status: sandbox.StatusSucceeded}
	for _, path := range []string{"/work/export/a.txt", "/work/export/sub/dir/b.txt", "/work/other.txt"} {
		d := sandbox.DigestBytes(arts[path])
		if _, _, err := f.srv.cfg.Blobs.Put(bytes.NewReader(arts[path]), d, 1<<20); err != nil {
			t.Fatal(err)
		}
		res.Artifacts = append(res.Artifacts, sandbox.Artifact{Path: path, Digest: d, Size: int64(len(arts[path]))})
	}
	daemonExport, err := evaluate.ExportOf(ctx, f.srv.cfg.Blobs, res, m.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	var tarBytes bytes.Buffer
	export, err := sandbox.WriteCandidateExport(&tarBytes, res, func(a sandbox.Artifact) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(arts[a.Path])), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if export != daemonExport || sandbox.DigestBytes(tarBytes.Bytes()) != export {
		t.Fatalf("public export %s, the daemon rebuilds %s", export, daemonExport)
	}
	g, err := sandbox.GraderJob(tp.Grader, *tp.Candidate, res, export)
	if err != nil {
		t.Fatal(err)
	}
	wantG := evalOf(t, m, b.Digest, b.LayerDigest, "").GraderJob(daemonExport, "g1")
	if err := wantG.Seal(); err != nil {
		t.Fatal(err)
	}
	if g.Digest != wantG.Digest {
		t.Fatalf("public grader job %s, the daemon judges %s", g.Digest, wantG.Digest)
	}
	if err := evaluate.SameJob("grader", g, wantG); err != nil {
		t.Fatal(err)
	}
	// A forged artifact content is refused, not exported.
	if _, err := sandbox.WriteCandidateExport(io.Discard, res, func(a sandbox.Artifact) (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(strings.Repeat("x", int(a.Size)))), nil
	}); err == nil || !strings.Contains(err.Error(), "hashes to") {
		t.Fatalf("forged artifact content: %v, want a digest mismatch", err)
	}
	// Another job's result is not this candidate's.
	other := res
	other.JobID = "c2"
	if _, err := sandbox.GraderJob(tp.Grader, *tp.Candidate, other, export); err == nil {
		t.Fatal("a grader job was built on another job's result")
	}

	for _, tc := range []struct {
		name string
		req  sandbox.PlanRequest
		want string
	}{
		{"another bundle.json", sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: append(blob(b.ConfigDigest), ' '), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1"}, "bundle_config hashes to"},
		{"no workspace", sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), CandidateJobID: "c1", GraderJobID: "g1"}, "workspace_digest"},
		{"bad id", sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "../g"}, "job.id"},
	} {
		if code, out := ask(tc.req); code != http.StatusBadRequest || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.name, code, out, tc.want)
		}
	}
}

// A daemon whose operator chose runsc plans runsc jobs, as `sandboxd run
// --runtime runsc` evaluates on runsc: the candidate job and the grader
// template, and the grader job a verifier completes from it, are the jobs
// the assess endpoint rebuilds on that runtime.
func TestPlanHonoursTheHostsRuntime(t *testing.T) {
	b, blob := exampleBundle(t)
	ws := sandbox.DigestBytes([]byte("workspace"))
	for _, rt := range []string{"", sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		f := newFixture(t, func(c *Config) { c.Runtime = rt }, nil)
		body, _ := json.Marshal(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1"})
		resp, out := f.do(t, http.MethodPost, "/v1/plan", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("runtime %q: plan: %d %s", rt, resp.StatusCode, out)
		}
		var p sandbox.Plan
		if err := json.Unmarshal(out, &p); err != nil {
			t.Fatal(err)
		}
		want := rt
		if want == "" {
			want = sandbox.RuntimeRunc
		}
		wantC := evalOf(t, b.Manifest, b.Digest, "", rt).CandidateJob(ws, "c1")
		if err := wantC.Seal(); err != nil {
			t.Fatal(err)
		}
		if p.Candidate == nil || p.Candidate.Runtime != want || p.Candidate.Digest != wantC.Digest || p.Grader.Runtime != want {
			t.Fatalf("runtime %q: plan candidate %+v grader runtime %q, want both on %s", rt, p.Candidate, p.Grader.Runtime, want)
		}
		res := sandbox.Result{Schema: sandbox.ResultSchema, JobID: p.Candidate.ID, JobDigest: p.Candidate.Digest, Status: sandbox.StatusSucceeded}
		export := sandbox.DigestBytes([]byte("export"))
		g, err := sandbox.GraderJob(p.Grader, *p.Candidate, res, export)
		if err != nil {
			t.Fatal(err)
		}
		wantG := evalOf(t, b.Manifest, b.Digest, b.LayerDigest, rt).GraderJob(export, "g1")
		if err := wantG.Seal(); err != nil {
			t.Fatal(err)
		}
		if g.Digest != wantG.Digest {
			t.Errorf("runtime %q: the verifier's grader job %s (%s), the daemon judges %s", rt, g.Digest, g.Runtime, wantG.Digest)
		}
	}
}

func TestConfigRefusesAnUnknownRuntime(t *testing.T) {
	c := newFixture(t, nil, nil).srv.cfg
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Runtime = "kata"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Runtime") {
		t.Errorf("got %v, want Runtime refused", err)
	}
}

// evalOf is the evaluation a bundle's manifest prescribes on runtime.
func evalOf(t *testing.T, m bundle.Manifest, digest, layer, runtime string) *evaluate.Evaluation {
	t.Helper()
	e, err := evaluate.New(m, digest, layer, runtime)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
