package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
)

func runCmd(t *testing.T, cmd func(context.Context, []string, io.Writer, io.Writer) int, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cmd(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "broker")
	t.Setenv(keyPasswordEnv, "pw")

	code, out, errOut := runCmd(t, cmdKeygen, "-o", prefix)
	if code != exitOK {
		t.Fatalf("keygen: exit %d, want %d; stderr %s", code, exitOK, errOut)
	}
	st, err := os.Stat(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode: got %v, want 0600", st.Mode().Perm())
	}
	s, err := receipt.LoadSigner(prefix+".key", []byte("pw"))
	if err != nil {
		t.Fatalf("LoadSigner on the keygen output: %v", err)
	}
	pub, err := os.ReadFile(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, s.PublicKeyPEM()) {
		t.Errorf(".pub: got %s, want the public half of .key %s", pub, s.PublicKeyPEM())
	}
	if !strings.Contains(out, s.KeyID()) {
		t.Errorf("stdout: got %q, want it to name key id %s", out, s.KeyID())
	}
	if _, err := receipt.LoadSigner(prefix+".key", []byte("other")); err == nil {
		t.Errorf("LoadSigner with the wrong password: got no error")
	}

	// Never overwrite: neither a full pair nor a lone .pub.
	before, _ := os.ReadFile(prefix + ".key")
	code, _, errOut = runCmd(t, cmdKeygen, "-o", prefix)
	if code != exitBadInput || !strings.Contains(errOut, "refusing to overwrite") {
		t.Errorf("second keygen: exit %d, stderr %q; want %d and a refusal", code, errOut, exitBadInput)
	}
	after, _ := os.ReadFile(prefix + ".key")
	if !bytes.Equal(before, after) {
		t.Errorf("second keygen changed the existing key")
	}
	lone := filepath.Join(dir, "lone")
	if err := os.WriteFile(lone+".pub", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := runCmd(t, cmdKeygen, "-o", lone); code != exitBadInput {
		t.Errorf("keygen over an existing .pub: exit %d, want %d", code, exitBadInput)
	}
	if _, err := os.Stat(lone + ".key"); !os.IsNotExist(err) {
		t.Errorf("keygen over an existing .pub left a .key behind (%v)", err)
	}

	// Empty password.
	t.Setenv(keyPasswordEnv, "")
	if code, _, errOut := runCmd(t, cmdKeygen, "-o", filepath.Join(dir, "empty")); code != exitOK {
		t.Fatalf("keygen with empty password: exit %d: %s", code, errOut)
	}
	if _, err := receipt.LoadSigner(filepath.Join(dir, "empty.key"), nil); err != nil {
		t.Errorf("LoadSigner with empty password: %v", err)
	}

	for _, args := range [][]string{nil, {"-o"}, {"-o", prefix, "extra"}, {"--nope"}} {
		if code, _, _ := runCmd(t, cmdKeygen, args...); code != exitUsage {
			t.Errorf("keygen %q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

type verifyFixture struct {
	dir                     string
	pub, otherPub           string
	job1, job2              string
	acc1, comp1, acc2       string
	comp2, tampered, byKey2 string
	passed, failed          string // signed test-result statements
	bundle, workspace       string // the digests the test-results are about
	otherBundle, otherWS    string // digests they are not about
}

func newVerifyFixture(t *testing.T) verifyFixture {
	t.Helper()
	dir := t.TempDir()
	s, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	other, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	must := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	facts := sandbox.RuntimeFacts{BrokerVersion: "test", Runtime: "runc"}
	at := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	jobs := make([]sandbox.Job, 2)
	f := verifyFixture{dir: dir}
	for i, id := range []string{"job-1", "job-2"} {
		j := sandbox.Job{
			Schema: sandbox.JobSchema, ID: id, Image: "sha256:" + strings.Repeat("ab", 32),
			Argv: []string{"/bin/true"}, WorkDir: sandbox.WorkPath, Limits: sandbox.DefaultLimits(),
			Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
		}
		if err := j.Seal(); err != nil {
			t.Fatal(err)
		}
		jobs[i] = j
	}
	result := func(j sandbox.Job) sandbox.Result {
		return sandbox.Result{Schema: sandbox.ResultSchema, JobID: j.ID, JobDigest: j.Digest, Status: sandbox.StatusSucceeded, StartedAt: at, EndedAt: at}
	}
	jb1, _ := json.Marshal(jobs[0])
	jb2, _ := json.Marshal(jobs[1])
	f.job1, f.job2 = write("job1.json", jb1), write("job2.json", jb2)
	f.pub, f.otherPub = write("broker.pub", s.PublicKeyPEM()), write("other.pub", other.PublicKeyPEM())
	acc1 := must(s.SignAccepted(jobs[0], facts, at))
	acc2 := must(s.SignAccepted(jobs[1], facts, at))
	f.acc1, f.acc2 = write("acc1.intoto.json", acc1), write("acc2.intoto.json", acc2)
	f.comp1 = write("comp1.intoto.json", must(s.SignCompleted(result(jobs[0]), acc1)))
	f.comp2 = write("comp2.intoto.json", must(s.SignCompleted(result(jobs[1]), acc2)))
	f.byKey2 = write("bykey2.intoto.json", must(other.SignAccepted(jobs[0], facts, at)))
	var env sandbox.Envelope
	if err := json.Unmarshal(acc1, &env); err != nil {
		t.Fatal(err)
	}
	sig, _ := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	sig[len(sig)-1] ^= 1
	env.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
	f.tampered = write("tampered.intoto.json", must(sandbox.CanonicalEnvelope(env)))
	testResult := func(result string, passed, failed []string) []byte {
		pred := must(json.Marshal(map[string]any{"result": result, "passedTests": passed, "warnedTests": []string{}, "failedTests": failed,
			"configuration": []sandbox.Subject{
				{Name: "bundle", Digest: map[string]string{"sha256": strings.Repeat("ee", 32)}},
				{Name: "image", Digest: map[string]string{"sha256": strings.Repeat("ab", 32)}},
			}}))
		return must(s.SignStatement(sandbox.Statement{
			Type:          sandbox.StatementType,
			Subject:       []sandbox.Subject{{Name: "candidate-workspace", Digest: map[string]string{"sha256": strings.Repeat("cd", 32)}}},
			PredicateType: sandbox.PredicateTestResult,
			Predicate:     pred,
		}))
	}
	f.passed = write("passed.intoto.json", testResult("PASSED", []string{"a", "b"}, []string{}))
	f.failed = write("failed.intoto.json", testResult("FAILED", []string{"a"}, []string{"b"}))
	f.bundle, f.workspace = "sha256:"+strings.Repeat("ee", 32), "sha256:"+strings.Repeat("cd", 32)
	f.otherBundle, f.otherWS = "sha256:"+strings.Repeat("e0", 32), "sha256:"+strings.Repeat("c0", 32)
	return f
}

func TestVerifyCommand(t *testing.T) {
	f := newVerifyFixture(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string // regexps, one per line, in order
	}{
		{"receipt and result", []string{"--key", f.pub, f.acc1, f.comp1}, exitOK, []string{
			`acc1.intoto.json: ok: receipt: job "job-1" \(sha256:[0-9a-f]{64}\) accepted 2025-06-01T00:00:00Z; signed by SHA256:\S+ \(broker reports an ephemeral key\)$`,
			`comp1.intoto.json: ok: result: job "job-1" .* succeeded, 0 artifacts; signed by SHA256:\S+ \(broker reports an ephemeral key\); chained to receipt .*acc1.intoto.json$`,
		}},
		{"bound to the job", []string{"--key", f.pub, "--job", f.job1, f.acc1, f.comp1}, exitOK, []string{
			`acc1.intoto.json: ok: .*; bound to .*job1.json$`,
			`comp1.intoto.json: ok: .*; bound to .*job1.json; chained to receipt .*acc1.intoto.json$`,
		}},
		{"result alone", []string{"--key", f.pub, "--job", f.job1, f.comp1}, exitOK, []string{
			`comp1.intoto.json: ok: .*; no verified receipt of this job given \(chained to sha256:[0-9a-f]{64}\)$`,
		}},
		{"rotation: either key pinned", []string{"--key", f.otherPub, "--key", f.pub, f.acc1, f.byKey2}, exitOK, []string{
			`acc1.intoto.json: ok: `, `bykey2.intoto.json: ok: `,
		}},
		{"receipt for another job", []string{"--key", f.pub, "--job", f.job2, f.acc1}, exitFailed, []string{
			`acc1.intoto.json: FAILED: job_binding: envelope is about job "job-1"`,
		}},
		{"two jobs, each result chained to its own receipt", []string{"--key", f.pub, f.acc2, f.comp2, f.acc1, f.comp1}, exitOK, []string{
			`acc2.intoto.json: ok`, `comp2.intoto.json: ok: .*acc2.intoto.json$`, `acc1.intoto.json: ok`, `comp1.intoto.json: ok: .*acc1.intoto.json$`,
		}},
		{"tampered signature", []string{"--key", f.pub, f.tampered, f.acc1}, exitFailed, []string{
			`tampered.intoto.json: FAILED: signature: signature 1 by pinned key SHA256:\S+ does not verify$`,
			`acc1.intoto.json: ok`,
		}},
		{"result whose receipt fails", []string{"--key", f.pub, f.tampered, f.comp1}, exitFailed, []string{
			`tampered.intoto.json: FAILED: signature`,
			`comp1.intoto.json: ok: .*no verified receipt of this job given`,
		}},
		{"wrong key", []string{"--key", f.otherPub, f.acc1}, exitFailed, []string{
			`acc1.intoto.json: FAILED: unknown_key: signed by \[SHA256:\S+\]; pinned \[SHA256:\S+\]$`,
		}},
		{"missing envelope", []string{"--key", f.pub, filepath.Join(f.dir, "nope.json")}, exitFailed, []string{
			`nope.json: FAILED: open .*: no such file or directory$`,
		}},
		{"job file is an envelope", []string{"--key", f.pub, "--job", f.acc1, f.acc1}, exitBadInput, nil},
		{"key file is not a key", []string{"--key", f.job1, f.acc1}, exitBadInput, nil},
		{"missing key file", []string{"--key", filepath.Join(f.dir, "nope.pub"), f.acc1}, exitBadInput, nil},
		// A well-signed test-result says its verdict, never a bare "ok";
		// --expect makes a verdict other than the expected one fail.
		{"test-result passed", []string{"--key", f.pub, f.passed}, exitOK, []string{
			`passed.intoto.json: verdict PASSED: test-result \(2 passed, 0 failed\) for candidate-workspace sha256:(cd){32} under bundle sha256:(ee){32}; signed by SHA256:\S+$`,
		}},
		{"test-result failed", []string{"--key", f.pub, f.failed}, exitOK, []string{
			`failed.intoto.json: verdict FAILED: test-result \(1 passed, 1 failed\) for candidate-workspace sha256:(cd){32} under bundle sha256:(ee){32}; signed by SHA256:\S+$`,
		}},
		{"expect passed, got passed", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--workspace", f.workspace, f.passed}, exitOK, []string{
			`passed.intoto.json: verdict PASSED: test-result \(2 passed, 0 failed\) for candidate-workspace sha256:(cd){32} under bundle sha256:(ee){32}; signed by SHA256:\S+; bound to --workspace; bound to --bundle$`,
		}},
		{"expect passed, got failed", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--workspace", f.workspace, f.failed}, exitFailed, []string{
			`failed.intoto.json: FAILED: verdict: the signed verdict is FAILED, --expect passed \(signature verified; 1 passed, 1 failed\)$`,
		}},
		{"expect failed, got passed", []string{"--key", f.pub, "--expect", "failed", "--bundle", f.bundle, "--workspace", f.workspace, f.passed, f.failed}, exitFailed, []string{
			`passed.intoto.json: FAILED: verdict: the signed verdict is PASSED, --expect failed`,
			`failed.intoto.json: verdict FAILED: `,
		}},
		{"expect without a test-result", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--workspace", f.workspace, f.acc1}, exitFailed, []string{
			`acc1.intoto.json: ok: receipt`,
			`FAILED: verdict: --expect passed, but no test-result statement was given`,
		}},
		// A pass is a pass of one workspace under one bundle: another
		// workspace's or another bundle's pass is not the one expected.
		{"expect passed, another workspace's pass", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--workspace", f.otherWS, f.passed}, exitFailed, []string{
			`passed.intoto.json: FAILED: workspace_binding: the test-result is about candidate-workspace sha256:(cd){32}, --workspace is sha256:(c0){32}$`,
			`FAILED: verdict: --expect passed, but no test-result statement was given`,
		}},
		{"expect passed, a pass under another bundle", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.otherBundle, "--workspace", f.workspace, f.passed}, exitFailed, []string{
			`passed.intoto.json: FAILED: bundle_binding: the test-result is about bundle sha256:(ee){32}, --bundle is sha256:(e0){32}$`,
			`FAILED: verdict: --expect passed, but no test-result statement was given`,
		}},
		{"expect passed, bound to a job but about a workspace", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--job", f.job1, f.passed}, exitFailed, []string{
			`passed.intoto.json: FAILED: job_binding: `,
			`FAILED: verdict: --expect passed, but no test-result statement was given`,
		}},
		{"expect without --bundle or --workspace", []string{"--key", f.pub, "--expect", "passed", f.passed}, exitUsage, nil},
		{"expect without --workspace", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, f.passed}, exitUsage, nil},
		{"expect without --bundle", []string{"--key", f.pub, "--expect", "passed", "--workspace", f.workspace, f.passed}, exitUsage, nil},
		{"--workspace not a digest", []string{"--key", f.pub, "--expect", "passed", "--bundle", f.bundle, "--workspace", "cdcd", f.passed}, exitUsage, nil},
		{"expect, bad value", []string{"--key", f.pub, "--expect", "PASS", f.passed}, exitUsage, nil},
		{"no key", []string{f.acc1}, exitUsage, nil},
		{"no envelope", []string{"--key", f.pub}, exitUsage, nil},
		{"unknown flag", []string{"--keys", f.pub, f.acc1}, exitUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, cmdVerify, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit: got %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, out, errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if out == "" {
				lines = nil
			}
			if len(lines) != len(tt.wantOut) {
				t.Fatalf("stdout: got %d lines, want %d:\n%s", len(lines), len(tt.wantOut), out)
			}
			for i, re := range tt.wantOut {
				if !regexp.MustCompile(re).MatchString(lines[i]) {
					t.Errorf("line %d: got %q, want a match for %q", i+1, lines[i], re)
				}
			}
		})
	}
}

// TestVerifyExpectNamesMissingBinding: --expect without the bundle and the
// candidate it is about is a usage error that says which is missing.
func TestVerifyExpectNamesMissingBinding(t *testing.T) {
	f := newVerifyFixture(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--expect", "passed"}, "--expect needs --bundle DIGEST and --workspace DIGEST (or --job JOBFILE)"},
		{[]string{"--expect", "passed", "--workspace", f.workspace}, "--expect needs --bundle DIGEST"},
		{[]string{"--expect", "failed", "--bundle", f.bundle}, "--expect needs --workspace DIGEST (or --job JOBFILE)"},
	} {
		code, out, errOut := runCmd(t, cmdVerify, append(append([]string{"--key", f.pub}, tc.args...), f.passed)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("verify %q: exit %d, stdout %q, stderr %q; want exit %d, no stdout and %q", tc.args, code, out, errOut, exitUsage, tc.want)
		}
	}
}

// TestVerifyCommandChainsResultToReceipt: a result next to its job's
// receipt must be chained to that very receipt.
func TestVerifyCommandChainsResultToReceipt(t *testing.T) {
	f := newVerifyFixture(t)
	acc1, _ := os.ReadFile(f.acc1)
	var env sandbox.Envelope
	if err := json.Unmarshal(acc1, &env); err != nil {
		t.Fatal(err)
	}
	// Same payload and signature, plus a duplicate signature: still valid,
	// but its digest differs from the receipt the result was chained to.
	env.Signatures = append(env.Signatures, env.Signatures[0])
	other, err := sandbox.CanonicalEnvelope(env)
	if err != nil {
		t.Fatal(err)
	}
	otherPath := filepath.Join(f.dir, "acc1-resigned.intoto.json")
	if err := os.WriteFile(otherPath, other, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCmd(t, cmdVerify, "--key", f.pub, otherPath, f.comp1)
	if code != exitFailed {
		t.Errorf("exit: got %d, want %d\n%s", code, exitFailed, out)
	}
	if !strings.Contains(out, "comp1.intoto.json: FAILED: receipt_binding: ") || !strings.Contains(out, "acc1-resigned.intoto.json: ok") {
		t.Errorf("stdout: got\n%s\nwant the receipt ok and the result failing receipt_binding", out)
	}
	// Given both receipts, the result is chained to the right one.
	code, out, _ = runCmd(t, cmdVerify, "--key", f.pub, otherPath, f.acc1, f.comp1)
	if code != exitOK || !strings.Contains(out, "chained to receipt "+f.acc1) {
		t.Errorf("with both receipts: exit %d, stdout\n%s\nwant 0 and the result chained to %s", code, out, f.acc1)
	}
}
