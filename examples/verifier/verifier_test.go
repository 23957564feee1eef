package verifier

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

var requiredChecks = []string{"add small", "add negative", "fib 10", "fib 90"}

func skipWithoutEngine(t *testing.T) {
	if env.d == nil {
		t.Skip("no container engine")
	}
}

// evaluation is one registered plan and the verifier over it.
type evaluation struct {
	reg Registration
	v   *SandboxTestVerifier
	b   Bundle
}

func candidateDir(name string) string {
	return filepath.Join(env.repo, "examples", "go-cli", "candidates", name)
}

// register reserves fresh ids and registers the bundle for a candidate
// workspace; mod may change the registration before it is frozen.
func register(t *testing.T, candidate string, required []string, mod func(*Registration)) (Registration, Bundle) {
	t.Helper()
	b, err := ReadBundle(env.layout)
	if err != nil {
		t.Fatal(err)
	}
	run := "v-" + randHex(4)
	reg, err := Register(context.Background(), env.d.client, b, candidateDir(candidate), Reserved{Candidate: run + "-candidate", Grader: run + "-grader"},
		required, "go-cli/1", filepath.Join(env.tmp, "evidence"))
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(&reg)
	}
	return reg, b
}

func newVerifier(t *testing.T, reg Registration, b Bundle, keys sandbox.KeySet) (*SandboxTestVerifier, error) {
	t.Helper()
	auth, err := sandbox.NewAuthenticity(keys)
	if err != nil {
		t.Fatal(err)
	}
	return NewSandboxTestVerifier(SandboxTestConfig{
		Registrations: []Registration{reg}, Runner: env.d.client, Blobs: env.d.client,
		Authenticity: auth, Supervisor: NewDaemonSupervisor(env.d.client, b),
	})
}

func evaluate(t *testing.T, candidate string) (evaluation, CheckResult) {
	t.Helper()
	reg, b := register(t, candidate, requiredChecks, nil)
	v, err := newVerifier(t, reg, b, env.keys)
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.EvaluateTests(context.Background(), TestRequest{ManifestDigest: reg.Manifest.Digest})
	if err != nil {
		t.Fatalf("%s: %v", candidate, err)
	}
	if res.PlanDigest == "" {
		t.Fatalf("%s: a result not bound to its plan", candidate)
	}
	if d, _ := reg.PlanDigest(); res.PlanDigest != d {
		t.Fatalf("%s: result bound to %s, the plan is %s", candidate, res.PlanDigest, d)
	}
	return evaluation{reg: reg, v: v, b: b}, res
}

func evidenceFile(t *testing.T, e evaluation, name string) string {
	t.Helper()
	d, _ := e.reg.PlanDigest()
	return filepath.Join(e.reg.OutputDir, strings.TrimPrefix(d, "sha256:")[:32], name)
}

// The known-good candidate passes, the known-bad one fails, and the
// candidate that reads the answers, overwrites the report, prints passing
// TAP and signals its grader does not pass. The same evaluation asked
// again returns the same result and the byte-identical signed assessment,
// which `sandboxd verify` checks offline with the pinned key.
func TestVerdicts(t *testing.T) {
	skipWithoutEngine(t)
	good, res := evaluate(t, "good")
	if res.Status != StatusPassed {
		t.Fatalf("good: %s (%s), want passed", res.Status, res.Reason)
	}
	if _, res := evaluate(t, "bad"); res.Status != StatusFailed {
		t.Errorf("bad: %s (%s), want failed", res.Status, res.Reason)
	}
	if _, res := evaluate(t, "forge"); res.Status == StatusPassed {
		t.Errorf("forge: passed (%s), want anything but passed", res.Reason)
	}

	first, err := os.ReadFile(evidenceFile(t, good, "assessment.json"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := good.v.EvaluateTests(context.Background(), TestRequest{ManifestDigest: good.reg.Manifest.Digest})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, res) {
		t.Fatalf("asked again: %+v, first %+v", again, res)
	}
	a, err := NewDaemonSupervisor(env.d.client, good.b).Assess(context.Background(), observation(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if string(a.Envelope) != string(first) {
		t.Fatal("the same assessment asked again is not the byte-identical signed assessment")
	}

	out, err := sandboxd("verify", "--key", env.pub, evidenceFile(t, good, "assessment.json"), evidenceFile(t, good, "grader.receipt.json"), evidenceFile(t, good, "grader.result.json"))
	if err != nil || !strings.Contains(out, "assessment: passed (4 checks)") {
		t.Fatalf("sandboxd verify with the pinned key: %v\n%s", err, out)
	}
	if out, err := sandboxd("verify", "--key", env.otherPub, evidenceFile(t, good, "assessment.json")); err == nil || !strings.Contains(out, "FAILED") {
		t.Fatalf("sandboxd verify with another key: %v\n%s, want a failure", err, out)
	}
}

// observation rebuilds what the verifier observed, from its evidence.
func observation(t *testing.T, e evaluation) SandboxObservation {
	t.Helper()
	grader, _ := signed(t, e, "grader")
	return SandboxObservation{Manifest: e.reg.Manifest, Candidate: e.reg.Plan.Candidate, Grader: grader,
		CandidateArtifacts: []Ref{{Name: "workspace", Digest: e.reg.Workspace}}}
}

func signed(t *testing.T, e evaluation, role string) (sandbox.Job, sandbox.SignedResult) {
	t.Helper()
	rb, err := os.ReadFile(evidenceFile(t, e, role+".receipt.json"))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := os.ReadFile(evidenceFile(t, e, role+".result.json"))
	if err != nil {
		t.Fatal(err)
	}
	att, err := sandbox.VerifyAttestation(env.keys, rb)
	if err != nil {
		t.Fatal(err)
	}
	job := att.Receipt.Job
	res, err := sandbox.VerifyResult(env.keys, eb, job, rb)
	if err != nil {
		t.Fatal(err)
	}
	return job, sandbox.SignedResult{Result: res, Envelope: eb, Receipt: sandbox.SignedReceipt{Receipt: *att.Receipt, Envelope: rb}}
}

// Authenticity refuses a receipt or result of another job, one signed by
// another key, and decoded values that are not their envelope's; a
// verifier pinning another key refuses the daemon's first receipt and
// never assesses.
func TestAuthenticityRefuses(t *testing.T) {
	skipWithoutEngine(t)
	e, _ := evaluate(t, "good")
	ctx := context.Background()
	auth, _ := sandbox.NewAuthenticity(env.keys)
	other, _ := sandbox.NewAuthenticity(env.otherKeys)
	cjob, cres := signed(t, e, "candidate")
	gjob, gres := signed(t, e, "grader")
	if err := auth.VerifyResult(ctx, gres, gjob); err != nil {
		t.Fatalf("the grader's own result: %v", err)
	}
	swapped := gres
	swapped.Result = cres.Result
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"candidate receipt as the grader's", auth.VerifyReceipt(ctx, cres.Receipt, gjob), sandbox.ErrJobBinding},
		{"grader result as the candidate's", auth.VerifyResult(ctx, gres, cjob), sandbox.ErrJobBinding},
		{"receipt under another pinned key", other.VerifyReceipt(ctx, cres.Receipt, cjob), sandbox.ErrUnknownKey},
		{"result under another pinned key", other.VerifyResult(ctx, gres, gjob), sandbox.ErrUnknownKey},
		{"another job's decoded result", auth.VerifyResult(ctx, swapped, gjob), sandbox.ErrPredicate},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}

	reg, b := register(t, "good", requiredChecks, nil)
	v, err := newVerifier(t, reg, b, env.otherKeys)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.EvaluateTests(ctx, TestRequest{ManifestDigest: reg.Manifest.Digest})
	if !errors.Is(err, sandbox.ErrUnknownKey) || errors.Is(err, ErrCallUncertain) {
		t.Fatalf("verifier pinning another key: %v, want the receipt refused (unknown_key)", err)
	}
	if _, err := env.d.client.Status(ctx, reg.Plan.Grader.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the grader job was dispatched after the candidate's receipt was refused: %v", err)
	}
}

// A plan whose required checks are not exactly the bundle's, or whose
// output lies inside the candidate's workspace, is refused before anything
// is dispatched.
func TestPlansRefusedBeforeAnythingRuns(t *testing.T) {
	skipWithoutEngine(t)
	outside, _ := os.MkdirTemp(env.tmp, "ws-")
	if err := os.CopyFS(outside, os.DirFS(candidateDir("good"))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		required []string
		mod      func(*Registration)
		want     string
	}{
		{"a required check left out", requiredChecks[:3], nil, "not exactly the bundle's"},
		{"a required check added", append([]string{"secret"}, requiredChecks...), nil, "not exactly the bundle's"},
		{"output inside the candidate's root", requiredChecks, func(r *Registration) {
			r.CandidateRoot = outside
			r.OutputDir = filepath.Join(outside, "out", "evidence")
		}, "inside the candidate's root"},
		{"output through a symlink into the candidate's root", requiredChecks, func(r *Registration) {
			link := filepath.Join(env.tmp, "link-"+randHex(3))
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			r.CandidateRoot, r.OutputDir = outside, filepath.Join(link, "evidence")
		}, "inside the candidate's root"},
		{"a grader template with the export's place taken", requiredChecks, func(r *Registration) {
			g := r.Plan.Grader
			g.Inputs = append(g.Inputs, sandbox.Input{Name: "candidate-export", Digest: r.Workspace, Path: sandbox.CandidateExportPath})
			g.Digest = ""
			if err := g.Seal(); err != nil {
				t.Fatal(err)
			}
			r.Plan.Grader = g
		}, "not the ones the bundle prescribes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, b := register(t, "good", tc.required, tc.mod)
			_, err := newVerifier(t, reg, b, env.keys)
			if !errors.Is(err, ErrPlanRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want the plan refused: %q", err, tc.want)
			}
			for _, id := range []string{reg.Plan.Candidate.ID, reg.Plan.Grader.ID} {
				if _, err := env.d.client.Status(context.Background(), id); !errors.Is(err, sandbox.ErrNotFound) {
					t.Fatalf("job %s exists after a refused plan: %v", id, err)
				}
			}
		})
	}
}

// The daemon is killed mid-dispatch: right after it journaled the
// candidate job, before it answered (the verifier cannot tell whether the
// job was accepted), and while the grader job runs. Either way the
// evaluation is uncertain; started again, the same registration (the same
// ids) reconciles to one result, asked again it is the same, and each
// job's container was created exactly once.
func TestDaemonKilledMidDispatch(t *testing.T) {
	skipWithoutEngine(t)
	for _, tc := range []struct {
		name  string
		fault func(Registration) string
	}{
		{"after accepting the candidate job", func(r Registration) string { return "accepted:" + r.Plan.Candidate.ID }},
		{"while the grader job runs", func(r Registration) string { return "started:" + r.Plan.Grader.ID }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := time.Now().Add(-time.Second)
			reg, b := register(t, "good", requiredChecks, nil)
			if err := env.d.stop(); err != nil {
				t.Fatal(err)
			}
			if err := env.d.start("SANDBOXD_TEST_FAULT=" + tc.fault(reg)); err != nil {
				t.Fatal(err)
			}
			v, err := newVerifier(t, reg, b, env.keys)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := v.EvaluateTests(ctx, TestRequest{ManifestDigest: reg.Manifest.Digest})
				done <- err
			}()
			select {
			case <-env.d.done: // the fault killed it
				env.d.cmd = nil
			case err := <-done:
				cancel()
				t.Fatalf("the evaluation ended before the daemon died: %v", err)
			}
			cancel()
			if err := <-done; !errors.Is(err, ErrCallUncertain) {
				t.Fatalf("with the daemon killed mid-dispatch: %v, want ErrCallUncertain", err)
			}
			if err := env.d.start(); err != nil {
				t.Fatal(err)
			}
			res, err := v.EvaluateTests(context.Background(), TestRequest{ManifestDigest: reg.Manifest.Digest})
			if err != nil {
				t.Fatalf("reconcile: %v", err)
			}
			// A job the daemon had not dispatched runs once after the
			// restart. A container that was running when the daemon died
			// is waited for and its stream read back; if the restarted
			// daemon cannot prove the stream whole it signs the result
			// uncertain, and the evaluation is inconclusive, never passed.
			e := evaluation{reg: reg, b: b}
			_, gres := signed(t, e, "grader")
			assessment, err := os.ReadFile(evidenceFile(t, e, "assessment.json"))
			if err != nil {
				t.Fatal(err)
			}
			va, err := sandbox.VerifyAssessmentEnvelope(env.keys, assessment)
			if err != nil {
				t.Fatal(err)
			}
			want := StatusPassed
			if gres.Result.Status == sandbox.StatusUncertain {
				want = StatusInconclusive
			}
			t.Logf("grader result: %s %s; assessment %s %v", gres.Result.Status, gres.Result.Cause, va.Assessment.Verdict, va.Assessment.Reasons)
			if res.Status != want {
				t.Fatalf("reconciled: %s (%s), want %s", res.Status, res.Reason, want)
			}
			again, err := v.EvaluateTests(context.Background(), TestRequest{ManifestDigest: reg.Manifest.Digest})
			if err != nil || !reflect.DeepEqual(again, res) {
				t.Fatalf("reconciled again: %+v %v, want %+v", again, err, res)
			}
			// A job whose container the restarted daemon proved never ran
			// its command (it logs so) runs in a second one.
			n := env.d.creations(t, since)
			for _, id := range []string{reg.Plan.Candidate.ID, reg.Plan.Grader.ID} {
				want := 1 + strings.Count(env.d.logs.String(), `"msg":"the job never ran; queued to run","job_id":"`+id+`"`)
				if n[id] != want {
					t.Errorf("job %s: %d containers created, want exactly %d", id, n[id], want)
				}
			}
		})
	}
}

// The kit's workspace digest is the one `sandboxd workspace ingest`
// computes for the same directory.
func TestWorkspaceDigestIsIngests(t *testing.T) {
	skipWithoutEngine(t)
	_, d, err := PackWorkspace(candidateDir("forge"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := sandboxd("workspace", "ingest", candidateDir("forge"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(out)
	if got := lines[len(lines)-1]; got != d {
		t.Fatalf("kit %s, sandboxd workspace ingest %s", d, got)
	}
}

// The kit is built from public packages only: nothing it (or its tests)
// links is under the repository's internal/.
func TestNoInternalPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/sandboxd/sandboxd/") && strings.Contains(p+"/", "/internal/") {
			t.Errorf("the kit links %s", p)
		}
	}
	if !strings.Contains(string(out), "github.com/sandboxd/sandboxd/sandbox/client") {
		t.Fatalf("go list named none of the kit's dependencies:\n%s", out)
	}
}
