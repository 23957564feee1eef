package verifier

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// renderRepoGo renders examples/repo-go's bundle as shipped (no candidate
// command: its grader applies the workspace's candidate.patch itself;
// controls known-good and known-bad) with the Go image, and packs it.
func renderRepoGo(t *testing.T) string {
	t.Helper()
	src := filepath.Join(env.repo, "examples", "repo-go")
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(src, "bundle"))); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(src, "bundle.json.in"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle.json"), []byte(strings.ReplaceAll(string(tmpl), "@GO_IMAGE@", env.image)), 0o644); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(t.TempDir(), "layout")
	if _, err := sandboxd("bundle", "pack", dir, "-o", layout); err != nil {
		t.Fatal(err)
	}
	return layout
}

// A repository instance whose bundle declares controls goes through the
// kit as a function-level bundle does: registered with its controls' jobs
// (ids derived from the run's), the controls run beside the candidate,
// and the daemon judges the candidate with their outcomes. The gold patch
// passes, the wrong one fails (neither inconclusive, as without the
// controls), and the signed assessment names the instance and both
// controls' assessments.
func TestRepositoryInstanceWithControls(t *testing.T) {
	skipWithoutEngine(t)
	ctx := context.Background()
	b, err := ReadBundle(renderRepoGo(t))
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Instance       string   `json:"instance"`
		RequiredChecks []string `json:"required_checks"`
	}
	if err := json.Unmarshal(b.Config, &config); err != nil {
		t.Fatal(err)
	}
	if config.Instance != "shop-go-bulk-threshold-1" {
		t.Fatalf("bundle instance %q", config.Instance)
	}
	for _, tc := range []struct {
		patch string
		want  Status
	}{{"gold.patch", StatusPassed}, {"wrong.patch", StatusFailed}} {
		t.Run(tc.patch, func(t *testing.T) {
			ws := t.TempDir()
			patch, err := os.ReadFile(filepath.Join(env.repo, "examples", "repo-go", "candidates", tc.patch))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ws, "candidate.patch"), patch, 0o644); err != nil {
				t.Fatal(err)
			}
			run := "r-" + randHex(4)
			reg, err := Register(ctx, env.d.client, b, ws, Reserved{Candidate: run + "-candidate", Grader: run + "-grader"},
				config.RequiredChecks, "repo-go/1", filepath.Join(env.tmp, "evidence"))
			if err != nil {
				t.Fatal(err)
			}
			if reg.Plan.Candidate.Digest != "" || len(reg.Plan.Controls) != 2 {
				t.Fatalf("plan: candidate %q, %d controls; want the grader job alone and two controls", reg.Plan.Candidate.Digest, len(reg.Plan.Controls))
			}
			for _, c := range reg.Plan.Controls {
				if c.Grader.ID != run+"-grader-"+c.Kind {
					t.Errorf("control %s grader job %s, want the id derived from the run's", c.Kind, c.Grader.ID)
				}
			}
			v, err := newVerifier(t, reg, b, env.keys)
			if err != nil {
				t.Fatal(err)
			}
			res, err := v.EvaluateTests(ctx, TestRequest{ManifestDigest: reg.Manifest.Digest})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Fatalf("%s: %s (%s), want %s", tc.patch, res.Status, res.Reason, tc.want)
			}
			e := evaluation{reg: reg, v: v, b: b}
			signed, err := os.ReadFile(evidenceFile(t, e, "assessment.json"))
			if err != nil {
				t.Fatal(err)
			}
			va, err := sandbox.VerifyAssessmentEnvelope(env.keys, signed)
			if err != nil {
				t.Fatal(err)
			}
			if va.Assessment.Instance != "shop-go-bulk-threshold-1" || va.Assessment.Verdict != sandbox.Verdict(tc.want) {
				t.Errorf("signed assessment: instance %q, verdict %s; want shop-go-bulk-threshold-1, %s", va.Assessment.Instance, va.Assessment.Verdict, tc.want)
			}
			var names []string
			for _, r := range va.Assessment.ObservationRefs {
				names = append(names, r.Name)
			}
			for _, want := range []string{"known-good/assessment", "known-good/grader/result", "known-bad/assessment", "known-bad/grader/result"} {
				if !slices.Contains(names, want) {
					t.Errorf("the signed assessment's observations %v do not name %s", names, want)
				}
			}
			for _, f := range []string{"known-good.grader.result.json", "known-bad.grader.result.json"} {
				if _, err := os.Stat(evidenceFile(t, e, f)); err != nil {
					t.Errorf("evidence: %v", err)
				}
			}
			// Asked again: the same result, nothing run twice.
			again, err := v.EvaluateTests(ctx, TestRequest{ManifestDigest: reg.Manifest.Digest})
			if err != nil || again.Status != res.Status || !slices.Equal(again.EvidenceIDs, res.EvidenceIDs) {
				t.Errorf("asked again: %v %s, want the same result", err, again.Status)
			}
		})
	}
}
