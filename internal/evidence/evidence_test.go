package evidence

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// fakeBroker "runs" the jobs of an evaluation without an engine: a
// candidate job exports one file naming its workspace, and the grader
// writes the real go test -json report of a passing package, or of a
// failing one when the workspace it grades is one of bad.
type fakeBroker struct {
	blobs *store.Store
	bad   map[string]bool // workspace digests whose grading fails
	// hostile are workspace digests whose candidate job also exports a
	// conftest.py, which the fixture bundle refuses.
	hostile map[string]bool
}

func (f *fakeBroker) Facts(context.Context) (sandbox.RuntimeFacts, error) {
	return sandbox.RuntimeFacts{BrokerVersion: "test", EngineVersion: "test", EngineAPI: "test", Runtime: "runc"}, nil
}

const markerPath = evaluate.ExportPath + "/workspace"

func (f *fakeBroker) Run(_ context.Context, j sandbox.Job) (sandbox.Result, error) {
	res := sandbox.Result{
		Schema: sandbox.ResultSchema, JobID: j.ID, JobDigest: j.Digest, Status: sandbox.StatusSucceeded,
		LimitsHit: []string{}, StartedAt: time.Unix(1, 0).UTC(), EndedAt: time.Unix(2, 0).UTC(), Rejected: []sandbox.Rejected{},
	}
	put := func(path string, b []byte) error {
		d, err := f.blobs.PutBytes(b)
		res.Artifacts = append(res.Artifacts, sandbox.Artifact{Path: path, Digest: d, Size: int64(len(b)), MediaType: "application/octet-stream"})
		return err
	}
	for _, in := range j.Inputs {
		switch in.Name {
		case "workspace": // the candidate job
			if f.hostile[in.Digest] {
				if err := put(evaluate.ExportPath+"/conftest.py", []byte("import os\n")); err != nil {
					return res, err
				}
			}
			return res, put(markerPath, []byte(in.Digest))
		case "candidate-export": // the grader job
			ws, err := f.exported(in.Digest)
			if err != nil {
				return res, err
			}
			fixture := "pass.json"
			if f.bad[ws] {
				fixture, res.Status, res.ExitCode = "fail.json", sandbox.StatusFailed, 1
			}
			report, err := os.ReadFile(filepath.Join("..", "supervisor", "testdata", "gotest", fixture))
			if err != nil {
				return res, err
			}
			return res, put(j.Env["SANDBOXD_REPORT"], report)
		}
	}
	return res, nil
}

// exported reads the workspace digest a candidate job exported.
func (f *fakeBroker) exported(export string) (string, error) {
	r, err := f.blobs.Open(export)
	if err != nil {
		return "", err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", err
		}
		if h.Name == "workspace" {
			b, err := io.ReadAll(tr)
			return string(b), err
		}
	}
}

// fixture is a bundle with a candidate command and both controls, a
// store, a broker that fails the known-bad control, and a signer. edits
// change the bundle's bundle.json before it is packed.
type fixture struct {
	bundle *bundle.Bundle
	blobs  *store.Store
	broker *fakeBroker
	signer *receipt.Signer
	keys   sandbox.KeySet
}

func newFixture(t *testing.T, edits ...func([]byte) []byte) *fixture {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	if err := os.CopyFS(src, os.DirFS("../bundle/testdata/example-bundle")); err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile(filepath.Join(src, "bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The fixtures' checks are package-qualified: all that are reported count.
	m = bytes.Replace(m, []byte(`"required_checks": ["TestAdd", "TestAddOverflow"],`), []byte(`"all_reported": true,`), 1)
	// A candidate's export may not hold a conftest.py (fakeBroker.hostile).
	m = bytes.Replace(m, []byte(`"all_reported": true,`), []byte(`"all_reported": true, "workspace": {"refuse": ["conftest.py"]},`), 1)
	for _, e := range edits {
		m = e(m)
	}
	if err := os.WriteFile(filepath.Join(src, "bundle.json"), m, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Pack(ctx, src, filepath.Join(t.TempDir(), "layout"), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CopyLayer(blobs); err != nil {
		t.Fatal(err)
	}
	e, err := evaluate.Of(b, "")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := e.ControlWorkspace(ctx, blobs, supervisor.ControlKnownBad)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sandbox.ParseKeySet(signer.PublicKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{bundle: b, blobs: blobs, broker: &fakeBroker{blobs: blobs, bad: map[string]bool{bad: true}}, signer: signer, keys: keys}
}

// workspace ingests a workspace of one file.
func (f *fixture) workspace(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "add.go"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := bundle.Ingest(context.Background(), f.blobs, dir, bundle.Options{Limits: bundle.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	return sum.Digest
}

// run evaluates a workspace and writes its evidence directory.
func (f *fixture) run(t *testing.T, runID, ws string) (string, *evaluate.Outcome) {
	t.Helper()
	sst, err := supervisor.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o, err := evaluate.Run(context.Background(), evaluate.Deps{
		Broker: f.broker, Blobs: f.blobs, Signer: f.signer, Supervisor: supervisor.New(sst),
	}, evaluate.Request{RunID: runID, Bundle: f.bundle, WorkspaceDigest: ws})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ev")
	if err := Write(dir, f.blobs, f.signer, f.bundle, ws, o); err != nil {
		t.Fatal(err)
	}
	return dir, o
}

func (f *fixture) check(t *testing.T, dir string) *Report {
	t.Helper()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rep, err := d.Check(context.Background(), f.keys, f.bundle)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// What Write writes, Check verifies and reproduces byte for byte.
func TestWrittenEvidenceReproduces(t *testing.T) {
	f := newFixture(t)
	dir, o := f.run(t, "run-a", f.workspace(t, "package add\n"))
	if o.Assessment.Verdict != supervisor.Passed {
		t.Fatalf("verdict %s, want passed: %v", o.Assessment.Verdict, o.Assessment.Reasons)
	}
	rep := f.check(t, dir)
	if len(rep.Problems) > 0 || !rep.Recomputed {
		t.Fatalf("problems: %q", rep.Problems)
	}
	if !bytes.Equal(rep.Assessment, o.AssessmentJSON) {
		t.Errorf("recomputed assessment:\n%s\nwant the run's:\n%s", rep.Assessment, o.AssessmentJSON)
	}
	// 6 jobs (candidate and grader of the candidate and of two controls),
	// each a receipt and a result, and the statement.
	if rep.Envelopes != 13 || rep.Verdict != supervisor.Passed {
		t.Errorf("got %d envelopes, verdict %s; want 13, passed", rep.Envelopes, rep.Verdict)
	}
}

// A candidate whose export the bundle's reader rules refuse is judged, not
// left without a verdict: failed on every check, with a signed statement,
// and an evidence check reproduces exactly that.
func TestRefusedExportFailsAndReproduces(t *testing.T) {
	f := newFixture(t)
	ws := f.workspace(t, "package add // leaves a conftest.py in its export\n")
	f.broker.hostile = map[string]bool{ws: true}
	dir, o := f.run(t, "run-a", ws)
	a := o.Assessment
	if a.Verdict != supervisor.Failed || len(a.Reasons) == 0 || !strings.HasPrefix(a.Reasons[0], string(supervisor.RuleCandidateExportRefused)+": ") ||
		!strings.Contains(a.Reasons[0], "conftest.py") {
		t.Fatalf("verdict %s, reasons %q; want failed by %s naming conftest.py", a.Verdict, a.Reasons, supervisor.RuleCandidateExportRefused)
	}
	if o.Statement == nil {
		t.Error("no signed test-result statement for a failed verdict")
	}
	for _, c := range o.Controls {
		if c.Assessment.Verdict == supervisor.Inconclusive {
			t.Errorf("control %s: inconclusive (%q)", c.Kind, c.Assessment.Reasons)
		}
	}
	rep := f.check(t, dir)
	if len(rep.Problems) > 0 || !rep.Recomputed || rep.Verdict != supervisor.Failed {
		t.Fatalf("check: verdict %s, problems %q", rep.Verdict, rep.Problems)
	}
	if !bytes.Equal(rep.Assessment, o.AssessmentJSON) {
		t.Errorf("recomputed assessment:\n%s\nwant the run's:\n%s", rep.Assessment, o.AssessmentJSON)
	}
}

// Open refuses what is not an evidence directory, naming why.
func TestOpenRefusesWhatIsNotEvidence(t *testing.T) {
	for name, index := range map[string]string{
		"no index.json":  "",
		"not JSON":       "{",
		"unknown field":  `{"schema":"sandboxd.evidence/v1","extra":1}`,
		"unknown schema": `{"schema":"sandboxd.evidence/v2"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if index != "" {
				if err := os.WriteFile(filepath.Join(dir, "index.json"), []byte(index), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			d, err := Open(dir)
			if err == nil {
				d.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name the directory", err)
			}
		})
	}
}

// evaluationOf is the evaluation of the jobs with the given roles.
func evaluationOf(t *testing.T, o *evaluate.Outcome, candidate, grader string) evaluate.Results {
	t.Helper()
	var e evaluate.Results
	for _, j := range o.Jobs {
		switch j.Role {
		case candidate:
			e.Candidate = &j.Result
			for _, in := range j.Job.Inputs {
				if in.Name == "workspace" {
					e.Workspace = in.Digest
				}
			}
		case grader:
			e.Grader = j.Result
		}
	}
	if e.Candidate == nil || e.Grader.JobID == "" {
		t.Fatalf("no %s and %s jobs", candidate, grader)
	}
	return e
}

// evaluation is what the fixture's bundle prescribes.
func (f *fixture) evaluation(t *testing.T) *evaluate.Evaluation {
	t.Helper()
	e, err := evaluate.Of(f.bundle, "")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// signedRun runs a job through the fake broker and signs its receipt and
// result, as a broker holding the pinned key would for any client.
func (f *fixture) signedRun(t *testing.T, role string, j sandbox.Job) evaluate.JobRecord {
	t.Helper()
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	facts, _ := f.broker.Facts(context.Background())
	rcpt, err := f.signer.SignAccepted(j, facts, time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.broker.Run(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	renv, err := f.signer.SignCompleted(res, rcpt)
	if err != nil {
		t.Fatal(err)
	}
	verified, err := sandbox.VerifyResult(f.keys, renv, j, rcpt)
	if err != nil {
		t.Fatal(err)
	}
	return evaluate.JobRecord{Role: role, Job: j, Result: verified, Receipt: rcpt, ResultEnvelope: renv}
}

// A control's evaluation is the bundle's control workspace under the
// control's own signed job ids, whatever index.json says. A forger who
// lists other signed jobs that pass as the known-good control's, and
// recomputes every assessment honestly for them, is refused.
func TestCheckTakesRolesFromSignedJobsNotTheIndex(t *testing.T) {
	for name, tc := range map[string]struct {
		// knownGood returns the jobs listed as the known-good control's.
		knownGood func(t *testing.T, f *fixture) []evaluate.JobRecord
		want      string // in a problem
	}{
		"another run's candidate": {
			knownGood: func(t *testing.T, f *fixture) []evaluate.JobRecord {
				_, b := f.run(t, "run-b", f.workspace(t, "package add // b\n"))
				var jobs []evaluate.JobRecord
				for _, j := range b.Jobs {
					if j.Role == "candidate" || j.Role == "grader" {
						jobs = append(jobs, j)
					}
				}
				return jobs
			},
			want: "index.json: job run-b-grader is listed as the known-good/grader job; its signed id makes it the grader job of run run-b",
		},
		"another run's known-good control": {
			knownGood: func(t *testing.T, f *fixture) []evaluate.JobRecord {
				_, b := f.run(t, "run-b", f.workspace(t, "package add // b\n"))
				var jobs []evaluate.JobRecord
				for _, j := range b.Jobs {
					if strings.HasPrefix(j.Role, "known-good/") {
						jobs = append(jobs, j)
					}
				}
				return jobs
			},
			want: "jobs/run-b-known-good-candidate.json: job run-b-known-good-candidate is of run run-b, not of run run-a like the other jobs",
		},
		"the control's own job ids on another workspace": {
			knownGood: func(t *testing.T, f *fixture) []evaluate.JobRecord {
				ws := f.workspace(t, "package add // b\n")
				e := f.evaluation(t)
				c := f.signedRun(t, "known-good/candidate", e.CandidateJob(ws, "run-a-known-good-candidate"))
				x, err := e.Handover(context.Background(), f.blobs, c.Result)
				if err != nil {
					t.Fatal(err)
				}
				g := f.signedRun(t, "known-good/grader", e.GraderJob(x.Digest, "run-a-known-good-grader"))
				return []evaluate.JobRecord{c, g}
			},
			want: "jobs/run-a-known-good-candidate.json: job run-a-known-good-candidate of control known-good judged workspace sha256:",
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			_, a := f.run(t, "run-a", f.workspace(t, "package add // a\n"))
			kg := tc.knownGood(t, f)

			// The forger's outcome: run A with those jobs as its
			// known-good control, and every assessment recomputed.
			forged := *a
			forged.Jobs = nil
			for _, j := range a.Jobs {
				if !strings.HasPrefix(j.Role, "known-good/") {
					forged.Jobs = append(forged.Jobs, j)
				}
			}
			for _, j := range kg {
				j.Role = "known-good/" + strings.TrimPrefix(j.Role, "known-good/")
				forged.Jobs = append(forged.Jobs, j)
			}
			controls := map[supervisor.ControlKind]evaluate.Results{
				supervisor.ControlKnownGood: evaluationOf(t, &forged, "known-good/candidate", "known-good/grader"),
				supervisor.ControlKnownBad:  evaluationOf(t, a, "known-bad/candidate", "known-bad/grader"),
			}
			candidate := evaluationOf(t, a, "candidate", "grader")
			var as supervisor.Assessment
			var err error
			forged.Controls, as, forged.AssessmentJSON, err = f.evaluation(t).Judge(f.blobs, controls, candidate, judge)
			if err != nil {
				t.Fatal(err)
			}
			forged.Assessment = as
			if as.Verdict != supervisor.Passed || bytes.Equal(forged.AssessmentJSON, a.AssessmentJSON) {
				t.Fatalf("not a forgery: verdict %s, assessment changed: %t", as.Verdict, !bytes.Equal(forged.AssessmentJSON, a.AssessmentJSON))
			}
			dir := filepath.Join(t.TempDir(), "forged")
			if err := Write(dir, f.blobs, f.signer, f.bundle, candidate.Workspace, &forged); err != nil {
				t.Fatal(err)
			}

			rep := f.check(t, dir)
			if len(rep.Problems) == 0 {
				t.Fatalf("the forged known-good control reproduced (verdict %s)", rep.Verdict)
			}
			found := false
			for _, p := range rep.Problems {
				found = found || strings.HasPrefix(p, tc.want)
			}
			if !found {
				t.Errorf("problems %q; want one starting %q", rep.Problems, tc.want)
			}
		})
	}
}

// Each tampering with a written directory is a problem naming the file,
// and when it is in what the supervisor reads, nothing is recomputed.
func TestCheckNamesTampering(t *testing.T) {
	f := newFixture(t)
	src, o := f.run(t, "run-a", f.workspace(t, "package add\n"))
	report := o.Assessment.Report.Digest
	for name, tc := range map[string]struct {
		tamper     func(t *testing.T, dir string)
		want       string
		recomputed bool
	}{
		"report artifact changed": {
			tamper: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, artifactFile(report)), func(b []byte) []byte {
					return bytes.Replace(b, []byte(`"Action":"pass"`), []byte(`"Action":"fail"`), 1)
				})
			},
			want: artifactFile(report) + ": report artifact of job run-a-grader (/work/report/test.json) does not hash to " + report,
		},
		"verdict changed in assessment.json": {
			tamper: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "assessment.json"), func(b []byte) []byte {
					i := bytes.LastIndex(b, []byte(`"verdict":"passed"`))
					return append(b[:i:i], append([]byte(`"verdict":"failed"`), b[i+len(`"verdict":"passed"`):]...)...)
				})
			},
			want:       `assessment.json: verdict: the evidence says "failed", recomputed "passed"`,
			recomputed: true,
		},
		"a control's verdict changed in the index": {
			tamper: func(t *testing.T, dir string) {
				edit(t, filepath.Join(dir, "index.json"), func(b []byte) []byte {
					return bytes.Replace(b, []byte(`"verdict": "failed"`), []byte(`"verdict": "passed"`), 1)
				})
			},
			want:       `index.json: control known-bad verdict is "passed", recomputed "failed"`,
			recomputed: true,
		},
		"an envelope the index does not name": {
			tamper: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, "extra.intoto.json"), o.Statement, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			want: "extra.intoto.json: an envelope index.json does not name",
		},
		"a job's role changed in the index": {
			tamper: func(t *testing.T, dir string) {
				// The two controls' graders swap roles.
				edit(t, filepath.Join(dir, "index.json"), func(b []byte) []byte {
					b = bytes.Replace(b, []byte(`"role": "known-bad/grader"`), []byte(`"role": "known-good/grader"`), 1)
					return bytes.Replace(b, []byte(`"role": "known-good/grader"`), []byte(`"role": "known-bad/grader"`), 1)
				})
			},
			want: "index.json: job run-a-known-good-grader is listed as the known-bad/grader job; its signed id makes it the known-good/grader job of run run-a",
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ev")
			if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, dir)
			rep := f.check(t, dir)
			found := false
			for _, p := range rep.Problems {
				found = found || strings.HasPrefix(p, tc.want)
			}
			if !found {
				t.Errorf("problems %q; want one starting %q", rep.Problems, tc.want)
			}
			if rep.Recomputed != tc.recomputed || (rep.Assessment != nil) != tc.recomputed {
				t.Errorf("recomputed %t (assessment %d bytes), want %t", rep.Recomputed, len(rep.Assessment), tc.recomputed)
			}
		})
	}
}

// edit rewrites a file.
func edit(t *testing.T, path string, change func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, change(b), 0o644); err != nil {
		t.Fatal(err)
	}
}
