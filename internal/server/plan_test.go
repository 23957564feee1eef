package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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
	if err := b.CopyLayer(f.srv.cfg.Blobs); err != nil {
		t.Fatal(err)
	}
	code, out := ask(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")})
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
		if err := b.CopyLayer(f.srv.cfg.Blobs); err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")})
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

// controlIDs are ids for the jobs of the example bundle's two controls.
func controlIDs(prefix string) map[string]sandbox.ControlIDs {
	return map[string]sandbox.ControlIDs{
		sandbox.ControlKnownGood: {CandidateJobID: prefix + "-good-c", GraderJobID: prefix + "-good-g"},
		sandbox.ControlKnownBad:  {CandidateJobID: prefix + "-bad-c", GraderJobID: prefix + "-bad-g"},
	}
}

// bundleWithout packs the example bundle with its bundle.json edited
// (here: its controls taken out).
func bundleWithout(t *testing.T, edit func(m map[string]any)) (*bundle.Bundle, func(digest string) []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(src, os.DirFS("../bundle/testdata/example-bundle")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(src, "bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "bundle.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Pack(context.Background(), src, t.TempDir(), bundle.DefaultLimits())
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

// A bundle that declares controls is planned with each control's jobs
// under the ids the caller reserved for it: on the control's workspace
// rebuilt from the stored layer, exactly the jobs `sandboxd run` runs for
// it. Ids missing for a declared control, ids for another, an id given
// twice and a layer not uploaded are refused, each by name; a bundle
// without controls is planned as before, byte for byte.
func TestPlanControls(t *testing.T) {
	ctx := context.Background()
	b, blob := exampleBundle(t)
	f := newFixture(t, nil, nil)
	ws := sandbox.DigestBytes([]byte("workspace"))
	req := sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")}
	ask := func(req sandbox.PlanRequest) (int, []byte) {
		body, _ := json.Marshal(req)
		resp, out := f.do(t, http.MethodPost, "/v1/plan", body)
		return resp.StatusCode, out
	}
	if code, out := ask(req); code != http.StatusNotFound || !strings.Contains(string(out), "layer "+b.LayerDigest) {
		t.Fatalf("layer not uploaded: %d %s, want 404 naming the layer", code, out)
	}
	if err := b.CopyLayer(f.srv.cfg.Blobs); err != nil {
		t.Fatal(err)
	}
	code, out := ask(req)
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, out)
	}
	var p sandbox.Plan
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(req); err != nil {
		t.Fatalf("the plan does not check against its request: %v", err)
	}
	e, err := evaluate.Of(b, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []supervisor.ControlKind{supervisor.ControlKnownGood, supervisor.ControlKnownBad} {
		cp, ok := p.Controls[string(kind)]
		if !ok {
			t.Fatalf("plan has no %s control: %s", kind, out)
		}
		want, err := e.ControlWorkspace(ctx, f.srv.cfg.Blobs, kind)
		if err != nil {
			t.Fatal(err)
		}
		ids := req.Controls[string(kind)]
		wantC, wantG := e.CandidateJob(want, ids.CandidateJobID), e.GraderTemplate(ids.GraderJobID)
		for _, j := range []*sandbox.Job{&wantC, &wantG} {
			if err := j.Seal(); err != nil {
				t.Fatal(err)
			}
		}
		if cp.WorkspaceDigest != want || cp.Candidate == nil || cp.Candidate.Digest != wantC.Digest || cp.Grader.Digest != wantG.Digest {
			t.Errorf("%s: plan %+v, want workspace %s, candidate %s, grader %s as sandboxd run makes them", kind, cp, want, wantC.Digest, wantG.Digest)
		}
	}
	// Plan.Check refuses a control's job moved to another workspace.
	moved := p
	moved.Controls = maps.Clone(p.Controls)
	good := moved.Controls[sandbox.ControlKnownGood]
	good.WorkspaceDigest = ws
	moved.Controls[sandbox.ControlKnownGood] = good
	if err := moved.Check(req); err == nil || !strings.Contains(err.Error(), "known-good candidate job does not take the workspace") {
		t.Errorf("a control's jobs on another workspace: %v, want refused", err)
	}

	onlyGood := map[string]sandbox.ControlIDs{sandbox.ControlKnownGood: req.Controls[sandbox.ControlKnownGood]}
	ugly := controlIDs("k")
	ugly["known-ugly"] = sandbox.ControlIDs{CandidateJobID: "u-c", GraderJobID: "u-g"}
	shared := controlIDs("k")
	shared[sandbox.ControlKnownBad] = sandbox.ControlIDs{CandidateJobID: "c1", GraderJobID: "k-bad-g"}
	for _, tc := range []struct {
		name     string
		controls map[string]sandbox.ControlIDs
		want     string
	}{
		{"no control ids", nil, "declares a known-good control"},
		{"known-bad missing", onlyGood, "declares a known-bad control"},
		{"an undeclared kind", ugly, "declares no known-ugly control"},
		{"an id given twice", shared, "share id c1"},
	} {
		r := req
		r.Controls = tc.controls
		if code, out := ask(r); code != http.StatusBadRequest || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.name, code, out, tc.want)
		}
	}

	// Without controls: no ids asked for, none given back, and controls
	// asked for are refused.
	nb, nblob := bundleWithout(t, func(m map[string]any) { delete(m, "controls") })
	plain := sandbox.PlanRequest{BundleManifest: nblob(nb.Digest), BundleConfig: nblob(nb.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1"}
	if body, _ := json.Marshal(plain); strings.Contains(string(body), "controls") {
		t.Fatalf("a request without controls names them: %s", body)
	}
	code, out = ask(plain)
	if code != http.StatusOK || strings.Contains(string(out), "controls") {
		t.Fatalf("bundle without controls: %d %s, want a plan without controls", code, out)
	}
	ne, err := evaluate.New(nb.Manifest, nb.Digest, nb.LayerDigest, "")
	if err != nil {
		t.Fatal(err)
	}
	np, err := ne.Plan(ws, "c1", "g1")
	if err != nil {
		t.Fatal(err)
	}
	if wantJSON, _ := json.Marshal(np); !bytes.Equal(bytes.TrimSpace(out), wantJSON) {
		t.Errorf("plan without controls:\n%s\nwant\n%s", out, wantJSON)
	}
	plain.Controls = controlIDs("k")
	if code, out := ask(plain); code != http.StatusBadRequest || !strings.Contains(string(out), "declares no known-") {
		t.Errorf("controls for a bundle without: %d %s, want 400", code, out)
	}
}

// With tenants, a bundle's controls are planned only from a layer the
// caller may read (one it uploaded): another tenant's upload is not
// found. The control workspaces a plan rebuilds are the caller's, so it
// may submit the controls' jobs.
func TestPlanControlsReadOnlyTheCallersLayer(t *testing.T) {
	b, blob := exampleBundle(t)
	r := newTenancyRig(t, "", func(c *Config) { c.MaxBlobBytes = 1 << 20 })
	layer, err := os.ReadFile(filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(b.LayerDigest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	if code, out := r.do(t, r.a, http.MethodPut, "/v1/blobs/"+b.LayerDigest, layer); code/100 != 2 {
		t.Fatalf("tenant-a uploads the layer: %d %s", code, out)
	}
	ws := sandbox.DigestBytes([]byte("workspace"))
	body, _ := json.Marshal(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")})
	if code, out := r.do(t, r.b, http.MethodPost, "/v1/plan", body); code != http.StatusNotFound || !strings.Contains(string(out), b.LayerDigest) {
		t.Fatalf("tenant-b plans from tenant-a's layer: %d %s, want 404 naming the layer", code, out)
	}
	code, out := r.do(t, r.a, http.MethodPost, "/v1/plan", body)
	if code != http.StatusOK {
		t.Fatalf("tenant-a plans: %d %s", code, out)
	}
	var p sandbox.Plan
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	good := p.Controls[sandbox.ControlKnownGood]
	if good.Candidate == nil {
		t.Fatalf("plan %s has no known-good candidate job", out)
	}
	// On the image the fixture's preflight admits: what is checked here
	// is who may read the control's workspace.
	good.Candidate.Image = testImage
	good.Candidate.Digest = ""
	if err := good.Candidate.Seal(); err != nil {
		t.Fatal(err)
	}
	job, _ := json.Marshal(good.Candidate)
	if code, out := r.do(t, r.b, http.MethodPost, "/v1/jobs", job); code != http.StatusUnprocessableEntity {
		t.Errorf("tenant-b submits a job on tenant-a's control workspace: %d %s, want 422", code, out)
	}
	if code, out := r.do(t, r.a, http.MethodPost, "/v1/jobs", job); code/100 != 2 {
		t.Errorf("tenant-a submits its known-good candidate job: %d %s", code, out)
	}
}

// The control workspaces a plan makes for a tenant are its uploads, as
// the layer it uploaded is: beyond its max_upload_bytes the plan is
// refused 507, naming the quota; within it, it plans. Before, they were
// leased and granted to it, counted by nothing.
func TestPlanControlWorkspacesCountAgainstTheUploadQuota(t *testing.T) {
	b, blob := exampleBundle(t)
	layer, err := os.ReadFile(filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(b.LayerDigest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest),
		WorkspaceDigest: sandbox.DigestBytes([]byte("workspace")), CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")})
	for _, tc := range []struct {
		room int64 // bytes of quota past the layer
		want int
	}{{1, http.StatusInsufficientStorage}, {16 << 20, http.StatusOK}} {
		r := newTenancyRig(t, fmt.Sprintf(`, "quota": {"max_upload_bytes": %d}`, int64(len(layer))+tc.room), func(c *Config) { c.MaxBlobBytes = 1 << 20 })
		if code, out := r.do(t, r.a, http.MethodPut, "/v1/blobs/"+b.LayerDigest, layer); code/100 != 2 {
			t.Fatalf("tenant-a uploads the layer: %d %s", code, out)
		}
		code, out := r.do(t, r.a, http.MethodPost, "/v1/plan", body)
		if code != tc.want || code != http.StatusOK && !strings.Contains(string(out), "control workspace this plan made counts as an upload") {
			t.Errorf("a plan with %d bytes of upload quota past the layer: %d %s, want %d", tc.room, code, out, tc.want)
		}
	}
}
