package evaluate

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Accept takes exactly the jobs the evaluation prescribes and hands the
// reader rules' word on the candidate's export to the supervisor as
// evidence: a refused export is judged (and fails), never an error that
// leaves the evaluation without a verdict.
func TestAcceptTakesOnlyThePrescribedJobs(t *testing.T) {
	ctx := context.Background()
	b, err := bundle.Pack(ctx, "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	b.Manifest.Workspace = &bundle.WorkspaceRules{Refuse: []string{"conftest.py"}}
	e := mustOf(t, b, "")
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws, err := ExportOf(ctx, blobs, sandbox.Result{}, b.Manifest.DefaultLimits) // a workspace of no files
	if err != nil {
		t.Fatal(err)
	}
	candidateRan := func(files map[string]string) *Ran {
		c := sealed(t, e.CandidateJob(ws, "c"))
		res := sandbox.Result{Schema: sandbox.ResultSchema, JobID: c.ID, JobDigest: c.Digest, Status: sandbox.StatusSucceeded}
		for name, content := range files {
			d, err := blobs.PutBytes([]byte(content))
			if err != nil {
				t.Fatal(err)
			}
			res.Artifacts = append(res.Artifacts, sandbox.Artifact{Path: ExportPath + "/" + name, Digest: d, Size: int64(len(content))})
		}
		return &Ran{Job: c, Result: res}
	}
	graderOn := func(c *Ran) Ran {
		x, err := e.Handover(ctx, blobs, c.Result)
		if err != nil {
			t.Fatal(err)
		}
		return Ran{Job: sealed(t, e.GraderJob(x.Digest, "g"))}
	}

	clean := candidateRan(map[string]string{"add.go": "package add\n"})
	r, err := e.Accept(ctx, blobs, ws, clean, graderOn(clean))
	if err != nil || r.Candidate == nil || r.ExportRefused != "" {
		t.Fatalf("the prescribed jobs on a clean export: %+v, %v", r, err)
	}

	hostile := candidateRan(map[string]string{"add.go": "package add\n", "conftest.py": "import os\n"})
	r, err = e.Accept(ctx, blobs, ws, hostile, graderOn(hostile))
	if err != nil {
		t.Fatalf("the prescribed jobs on a refused export: %v, want them judged", err)
	}
	if !strings.Contains(r.ExportRefused, "conftest.py") {
		t.Errorf("refused export: ExportRefused %q, want it to name conftest.py", r.ExportRefused)
	}
	ev, done := e.Evidence(blobs, r, nil)
	done()
	if ev.ExportRefused != r.ExportRefused || ev.Candidate == nil {
		t.Errorf("the supervisor's evidence lost the refusal: %q", ev.ExportRefused)
	}

	other := sealed(t, e.CandidateJob(ws, "c"))
	other.Argv = []string{"/bin/true"}
	for name, tc := range map[string]struct {
		candidate *Ran
		grader    Ran
	}{
		"grader on another export":   {clean, graderOn(hostile)},
		"no candidate job":           {nil, graderOn(clean)},
		"another candidate command":  {&Ran{Job: sealed(t, other), Result: clean.Result}, graderOn(clean)},
		"candidate on another input": {&Ran{Job: sealed(t, e.CandidateJob(sandbox.DigestBytes([]byte("x")), "c")), Result: clean.Result}, graderOn(clean)},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := e.Accept(ctx, blobs, ws, tc.candidate, tc.grader); !errors.Is(err, ErrNotPrescribed) {
				t.Errorf("got %v, want an error wrapping ErrNotPrescribed", err)
			}
		})
	}

	noCandidate := b.Manifest
	noCandidate.Candidate = nil
	nc, err := New(noCandidate, b.Digest, b.LayerDigest, "")
	if err != nil {
		t.Fatal(err)
	}
	g := Ran{Job: sealed(t, nc.GraderJob(ws, "g"))}
	if _, err := nc.Accept(ctx, blobs, ws, nil, g); err != nil {
		t.Errorf("a bundle without a candidate command, its grader on the workspace: %v", err)
	}
	if _, err := nc.Accept(ctx, blobs, ws, clean, g); !errors.Is(err, ErrNotPrescribed) {
		t.Errorf("a candidate job for a bundle without one: got %v, want ErrNotPrescribed", err)
	}
}

// Every export the broker can collect can be handed over: a candidate
// cannot move its verdict to inconclusive by exporting a tree the ingest
// would refuse. The deepest the collector takes (artifact paths of at
// most sandbox.MaxArtifactPathBytes) is far deeper than a workspace may be.
func TestHandoverTakesEveryCollectableExport(t *testing.T) {
	ctx := context.Background()
	b, err := bundle.Pack(ctx, "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	e := mustOf(t, b, "")
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := blobs.PutBytes([]byte("deep\n"))
	if err != nil {
		t.Fatal(err)
	}
	deepest := ExportPath + strings.Repeat("/a", (sandbox.MaxArtifactPathBytes-len(ExportPath))/2)
	res := sandbox.Result{Artifacts: []sandbox.Artifact{{Path: deepest, Digest: d, Size: 5}}}
	x, err := e.Handover(ctx, blobs, res)
	if err != nil || x.Refused != "" {
		t.Fatalf("an export %d components deep (%d bytes): %+v, %v", strings.Count(deepest, "/")-2, len(deepest), x, err)
	}
}
