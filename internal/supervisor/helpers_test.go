package supervisor

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

const (
	testBundle    = "sha256:b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	testImage     = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	testGraderJob = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	testCandJob   = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	testWorkspace = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	testReport    = "/work/out/report"
)

// graderResult returns a well-formed grader result that collected report
// at testReport and exited with exit.
func graderResult(report []byte, exit int) sandbox.Result {
	st := sandbox.StatusSucceeded
	if exit != 0 {
		st = sandbox.StatusFailed
	}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	return sandbox.Result{
		Schema:    sandbox.ResultSchema,
		JobID:     "grader-1",
		JobDigest: testGraderJob,
		Status:    st,
		LimitsHit: []string{},
		ExitCode:  exit,
		StartedAt: t0,
		EndedAt:   t0.Add(3 * time.Second),
		Stdout:    sandbox.Log{Digest: sandbox.DigestBytes(nil)},
		Stderr:    sandbox.Log{Digest: sandbox.DigestBytes(nil)},
		Artifacts: []sandbox.Artifact{{
			Path: testReport, Digest: sandbox.DigestBytes(report), Size: int64(len(report)), MediaType: "application/octet-stream",
		}},
		Rejected: []sandbox.Rejected{},
	}
}

// evidence returns sound evidence for report under policy p.
func evidence(p Policy, report []byte, exit int) Evidence {
	p.ReportPath = testReport
	return Evidence{
		BundleDigest:       testBundle,
		ImageID:            testImage,
		CandidateJobDigest: testCandJob,
		WorkspaceDigest:    testWorkspace,
		Policy:             p,
		Grader:             graderResult(report, exit),
		Report:             bytes.NewReader(report),
	}
}

func mustJudge(t *testing.T, ev Evidence) Assessment {
	t.Helper()
	a, err := Judge(ev)
	if err != nil {
		t.Fatalf("Judge: %v", err)
	}
	return a
}

func hasReason(a Assessment, r Rule) bool {
	for _, s := range a.Reasons {
		if s == string(r) || strings.HasPrefix(s, string(r)+": ") {
			return true
		}
	}
	for _, c := range a.Checks {
		if c.Reason == string(r) || strings.HasPrefix(c.Reason, string(r)+": ") {
			return true
		}
	}
	return false
}
