package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// verifyKeyFlags collects repeated --key flags.
type verifyKeyFlags []string

func (k *verifyKeyFlags) String() string     { return strings.Join(*k, ",") }
func (k *verifyKeyFlags) Set(v string) error { *k = append(*k, v); return nil }

type verifyOptions struct {
	keys    verifyKeyFlags // public key files, all pinned
	jobFile string         // sealed job the envelopes must be about
	expect  string         // the verdict every test-result must have: "", passed or failed
	json    bool           // print the outcome as JSON (docs/schema/verify.json)
	// bundle and workspace are the digests a verdict must be about; --expect
	// needs the bundle and the workspace (or --job).
	bundle, workspace string
}

// bindingsMissing names what --expect needs and was not given: a verdict
// names the candidate (a workspace, else a job) and the bundle that judged
// it, and a verdict about anything else is not the one expected.
func (o verifyOptions) bindingsMissing() string {
	var missing []string
	if o.bundle == "" {
		missing = append(missing, "--bundle DIGEST")
	}
	if o.workspace == "" && o.jobFile == "" {
		missing = append(missing, "--workspace DIGEST (or --job JOBFILE)")
	}
	return strings.Join(missing, " and ")
}

// verified is one envelope given on the command line and what became of it.
type verified struct {
	path  string
	bytes []byte
	att   sandbox.Attestation
	err   error
	notes []string
	// testResult is set for a signed in-toto test-result statement (the
	// supervisor's verdict), which binds a workspace, not a job.
	testResult *sandbox.TestResult
	// assessment is set for a signed assessment, which binds two jobs.
	assessment *sandbox.VerifiedAssessment
}

// assessmentAbout reports whether a signed assessment judged job, as its
// candidate or its grader job.
func assessmentAbout(a sandbox.Assessment, job sandbox.Job) error {
	if (a.CandidateJob == job.ID && a.CandidateDigest == job.Digest) || (a.GraderJob == job.ID && a.GraderDigest == job.Digest) {
		return nil
	}
	return &sandbox.VerifyError{Check: sandbox.CheckJobBinding, Detail: fmt.Sprintf("assessment is about jobs %q and %q, not %q (%s)", a.CandidateJob, a.GraderJob, job.ID, job.Digest)}
}

// testResultAbout checks a test-result against the bundle, workspace and
// job given: its configuration's bundle against --bundle, its subject (a
// workspace, else the candidate job) against --workspace or --job.
func testResultAbout(st *sandbox.TestResult, o verifyOptions, job *sandbox.Job) (notes []string, err error) {
	if o.bundle != "" {
		if got := st.Bundle(); got != o.bundle {
			return nil, fmt.Errorf("bundle_binding: the test-result is about bundle %s, --bundle is %s", orNone(got), o.bundle)
		}
	}
	name, digest := st.Subject()
	switch {
	case len(st.Subjects) != 1:
		if o.workspace != "" || job != nil {
			return nil, fmt.Errorf("subject: the test-result names %d subjects, not one candidate", len(st.Subjects))
		}
	case name == "candidate-workspace" && o.workspace != "":
		if digest != o.workspace {
			return nil, fmt.Errorf("workspace_binding: the test-result is about %s %s, --workspace is %s", name, orNone(digest), o.workspace)
		}
		notes = append(notes, "bound to --workspace")
	case name == "candidate-job" && job != nil:
		if digest != job.Digest {
			return nil, fmt.Errorf("job_binding: the test-result is about %s %s, not job %s (%s)", name, orNone(digest), job.ID, job.Digest)
		}
		notes = append(notes, "bound to "+o.jobFile)
	case job != nil:
		// It names a workspace, not a job: it cannot be shown to be
		// bound to --job, so it does not pass.
		return nil, fmt.Errorf("job_binding: a test-result statement is about %s %s, not bound to job %s; verify it with --workspace", name, orNone(digest), job.ID)
	case o.workspace != "":
		return nil, fmt.Errorf("workspace_binding: the test-result is about %s %s, not a workspace; verify it with --job", name, orNone(digest))
	}
	if o.bundle != "" {
		notes = append(notes, "bound to --bundle")
	}
	return notes, nil
}

// assessmentBound checks a signed assessment against the bundle and
// workspace given (--job is assessmentAbout's).
func assessmentBound(a sandbox.Assessment, o verifyOptions) (notes []string, err error) {
	if o.bundle != "" && a.ManifestDigest != o.bundle {
		return nil, fmt.Errorf("bundle_binding: the assessment is about bundle %s, --bundle is %s", a.ManifestDigest, o.bundle)
	}
	if o.workspace != "" {
		if a.WorkspaceDigest != o.workspace {
			return nil, fmt.Errorf("workspace_binding: the assessment is about workspace %s, --workspace is %s", orNone(a.WorkspaceDigest), o.workspace)
		}
		notes = append(notes, "bound to --workspace")
	}
	if o.bundle != "" {
		notes = append(notes, "bound to --bundle")
	}
	return notes, nil
}

func orNone(digest string) string {
	if digest == "" {
		return "(none)"
	}
	return digest
}

// cmdVerify checks receipts and results offline against pinned keys. It
// prints one line per envelope and exits 0 only if every envelope verifies,
// is about --job when one is given, and every result is chained to the
// receipt of its job when that receipt is among the envelopes. A signed
// test-result says its verdict first: a well-signed FAILED verdict is a
// fact that verifies, so only --expect makes the verdict an exit code.
func cmdVerify(_ context.Context, args []string, stdout, stderr io.Writer) int {
	o, fset := verifyFlags(stderr)
	if code := parseFlags(fset, args); code >= 0 {
		return code
	}
	if code := o.checkUsage(fset, stderr); code >= 0 {
		return code
	}
	keys, err := readKeySet(o.keys)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: verify: %v\n", err)
		return exitBadInput
	}
	job, err := o.readJob()
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: verify: %v\n", err)
		return exitBadInput
	}
	envs := make([]*verified, 0, fset.NArg())
	for _, p := range fset.Args() {
		envs = append(envs, verifyEnvelope(keys, job, *o, p))
	}
	for _, v := range envs {
		if v.err == nil && v.att.Completion != nil {
			chainResult(keys, job, v, envs)
		}
	}
	verdicts := checkVerdicts(envs, o.expect)
	if o.json {
		rep := verifyReport(envs, o.expect != "" && verdicts == 0)
		printJSON(stdout, stderr, rep)
		if !rep.Verified {
			return exitFailed
		}
		return exitOK
	}
	return printVerified(stdout, envs, o.expect, verdicts)
}

// verifyFlags declares the flags of `sandboxd verify`.
func verifyFlags(stderr io.Writer) (*verifyOptions, *flag.FlagSet) {
	o := &verifyOptions{}
	fset := flag.NewFlagSet("verify", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Var(&o.keys, "key", "pinned public key `PEM` file (repeat for key rotation)")
	fset.StringVar(&o.jobFile, "job", "", "sealed job `FILE` every envelope must be bound to")
	fset.StringVar(&o.expect, "expect", "", "exit 1 unless a test-result or signed assessment is given and every one's verdict is `VERDICT` (passed or failed); needs --bundle and --workspace or --job")
	fset.StringVar(&o.bundle, "bundle", "", "the bundle `DIGEST` every test-result and assessment must be about")
	fset.StringVar(&o.workspace, "workspace", "", "the workspace `DIGEST` every test-result and assessment must be about")
	fset.BoolVar(&o.json, "json", false, "print one line of JSON (docs/schema/verify.json) instead of a line per envelope")
	fset.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd verify --key PUB [--key PUB2] [--job JOBFILE] [--expect passed|failed --bundle DIGEST --workspace DIGEST] [--json] ENVELOPE...")
		fset.PrintDefaults()
	}
	return o, fset
}

// checkUsage refuses what the flags cannot mean together (exitUsage).
func (o *verifyOptions) checkUsage(fset *flag.FlagSet, stderr io.Writer) int {
	if len(o.keys) == 0 || fset.NArg() == 0 {
		fset.Usage()
		return exitUsage
	}
	if o.expect != "" && o.expect != "passed" && o.expect != "failed" {
		fmt.Fprintf(stderr, "sandboxd verify: --expect %q: want passed or failed\n", o.expect)
		return exitUsage
	}
	if missing := o.bindingsMissing(); o.expect != "" && missing != "" {
		fmt.Fprintf(stderr, "sandboxd verify: --expect needs %s: a verdict is only the one expected if it is about that bundle and that candidate\n", missing)
		return exitUsage
	}
	for _, d := range [][2]string{{"--bundle", o.bundle}, {"--workspace", o.workspace}} {
		if d[1] != "" && !sandbox.ValidDigest(d[1]) {
			fmt.Fprintf(stderr, "sandboxd verify: %s %q: want a sha256:<64 hex> digest\n", d[0], d[1])
			return exitUsage
		}
	}
	return -1
}

// readKeySet reads the pinned public key files.
func readKeySet(paths []string) (sandbox.KeySet, error) {
	var pems [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return sandbox.KeySet{}, err
		}
		pems = append(pems, b)
	}
	return sandbox.ParseKeySet(pems...)
}

// readJob reads the sealed job of --job, or nil without it.
func (o *verifyOptions) readJob() (*sandbox.Job, error) {
	if o.jobFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(o.jobFile)
	if err != nil {
		return nil, err
	}
	j, err := sandbox.DecodeJob(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.jobFile, err)
	}
	return &j, nil
}

// verifyEnvelope verifies one envelope file: a receipt or result (bound to
// job when one is given), else a signed assessment or a test-result
// statement (bound to the bundle, workspace and job given).
func verifyEnvelope(keys sandbox.KeySet, job *sandbox.Job, o verifyOptions, path string) *verified {
	v := &verified{path: path}
	if v.bytes, v.err = os.ReadFile(path); v.err != nil {
		return v
	}
	if v.att, v.err = sandbox.VerifyAttestation(keys, v.bytes); v.err != nil {
		if errors.Is(v.err, sandbox.ErrPredicateType) {
			verifyStatement(keys, job, o, v)
		}
		return v
	}
	if job != nil {
		if v.err = v.att.CheckJob(*job); v.err != nil {
			return v
		}
		v.notes = append(v.notes, "bound to "+o.jobFile)
	}
	return v
}

// verifyStatement verifies an envelope that is no receipt or result: a
// signed assessment, else a test-result statement. v.err stays the
// attestation's error if it is neither.
func verifyStatement(keys sandbox.KeySet, job *sandbox.Job, o verifyOptions, v *verified) {
	va, err := sandbox.VerifyAssessmentEnvelope(keys, v.bytes)
	switch {
	case err == nil:
		v.err, v.assessment = nil, &va
		v.notes, v.err = assessmentBound(va.Assessment, o)
		if v.err == nil && job != nil {
			if v.err = assessmentAbout(va.Assessment, *job); v.err == nil {
				v.notes = append(v.notes, "bound to "+o.jobFile)
			}
		}
	case !errors.Is(err, sandbox.ErrPredicateType):
		v.err = err
	default:
		if tr, err := sandbox.VerifyTestResult(keys, v.bytes); err == nil {
			v.testResult = &tr
			v.notes, v.err = testResultAbout(&tr, o, job)
		}
	}
}

// checkVerdicts fails each verified test-result and signed assessment
// whose verdict is not --expect's, and returns how many verdicts were
// given.
func checkVerdicts(envs []*verified, expect string) (verdicts int) {
	for _, v := range envs {
		if v.err == nil && v.testResult != nil {
			verdicts++
			if got := v.testResult.Result; expect != "" && !strings.EqualFold(got, expect) {
				v.err = fmt.Errorf("verdict: the signed verdict is %s, --expect %s (signature verified; %d passed, %d failed)",
					got, expect, len(v.testResult.PassedTests), len(v.testResult.FailedTests))
			}
		}
		// A signed assessment carries a verdict too, inconclusive ones
		// included.
		if v.err == nil && v.assessment != nil {
			verdicts++
			if got := v.assessment.Assessment.Verdict; expect != "" && string(got) != expect {
				v.err = fmt.Errorf("verdict: the signed assessment's verdict is %s, --expect %s (signature verified)", got, expect)
			}
		}
	}
	return verdicts
}

// printVerified prints a line per envelope and returns the exit code:
// exitFailed if any did not verify, or --expect found no verdict.
func printVerified(stdout io.Writer, envs []*verified, expect string, verdicts int) int {
	code := exitOK
	for _, v := range envs {
		switch {
		case v.err != nil:
			fmt.Fprintf(stdout, "%s: FAILED: %s\n", v.path, describeFailure(v.err))
			code = exitFailed
		case v.testResult != nil:
			fmt.Fprintf(stdout, "%s: verdict %s: %s\n", v.path, v.testResult.Result, describe(v))
		default:
			fmt.Fprintf(stdout, "%s: ok: %s\n", v.path, describe(v))
		}
	}
	if expect != "" && verdicts == 0 {
		fmt.Fprintf(stdout, "sandboxd verify: FAILED: verdict: --expect %s, but no test-result statement was given\n", expect)
		code = exitFailed
	}
	return code
}

// chainResult checks a verified result against the receipts of its job
// among envs, through sandbox.VerifyResult.
func chainResult(keys sandbox.KeySet, job *sandbox.Job, res *verified, envs []*verified) {
	var receipts []*verified
	for _, r := range envs {
		if r.err == nil && r.att.Receipt != nil && r.att.JobID() == res.att.JobID() && r.att.JobDigest() == res.att.JobDigest() {
			receipts = append(receipts, r)
		}
	}
	if len(receipts) == 0 {
		res.notes = append(res.notes, "no verified receipt of this job given (chained to "+res.att.Completion.ReceiptDigest+")")
		return
	}
	for _, r := range receipts {
		if r.att.Digest != res.att.Completion.ReceiptDigest {
			continue
		}
		bindTo := r.att.Receipt.Job
		if job != nil {
			bindTo = *job
		}
		if _, err := sandbox.VerifyResult(keys, res.bytes, bindTo, r.bytes); err != nil {
			res.err = err
			return
		}
		res.notes = append(res.notes, "chained to receipt "+r.path)
		return
	}
	res.err = &sandbox.VerifyError{
		Check:  sandbox.CheckReceiptBinding,
		Detail: fmt.Sprintf("result is chained to receipt %s; no receipt given for job %q has that digest", res.att.Completion.ReceiptDigest, res.att.JobID()),
	}
}

// instanceNote names a bundle's instance after its digest, if it has one.
func instanceNote(instance string) string {
	if instance == "" {
		return ""
	}
	return " (instance " + instance + ")"
}

func describe(v *verified) string {
	var b strings.Builder
	if va := v.assessment; va != nil {
		a := va.Assessment
		fmt.Fprintf(&b, "assessment: %s (%d checks) of candidate job %q and grader job %q, workspace %s, bundle %s%s, %s; signed by %s",
			a.Verdict, len(a.Checks), a.CandidateJob, a.GraderJob, orNone(a.WorkspaceDigest), a.ManifestDigest, instanceNote(a.Instance), a.SupervisorRevision, strings.Join(va.KeyIDs, ", "))
		for _, n := range v.notes {
			b.WriteString("; " + n)
		}
		return b.String()
	}
	if tr := v.testResult; tr != nil {
		name, digest := tr.Subject()
		fmt.Fprintf(&b, "test-result (%d passed, %d failed) for %s %s under bundle %s%s; signed by %s",
			len(tr.PassedTests), len(tr.FailedTests), name, orNone(digest), orNone(tr.Bundle()), instanceNote(tr.Instance), strings.Join(tr.KeyIDs, ", "))
		for _, n := range v.notes {
			b.WriteString("; " + n)
		}
		return b.String()
	}
	var broker sandbox.BrokerIdentity
	if r := v.att.Receipt; r != nil {
		broker = r.Broker
		fmt.Fprintf(&b, "receipt: job %q (%s) accepted %s", r.Job.ID, r.Job.Digest, r.AcceptedAt.Format("2006-01-02T15:04:05Z07:00"))
	} else {
		c := v.att.Completion
		broker = c.Broker
		fmt.Fprintf(&b, "result: job %q (%s) %s", c.Result.JobID, c.Result.JobDigest, c.Result.Status)
		if c.Result.Status == sandbox.StatusFailed {
			fmt.Fprintf(&b, " (exit %d)", c.Result.ExitCode)
		}
		fmt.Fprintf(&b, ", %d artifacts", len(c.Result.Artifacts))
	}
	fmt.Fprintf(&b, "; signed by %s", strings.Join(v.att.KeyIDs, ", "))
	if broker.EphemeralKey {
		b.WriteString(" (broker reports an ephemeral key)")
	}
	for _, n := range v.notes {
		b.WriteString("; " + n)
	}
	return b.String()
}

// describeFailure leads with the check that failed, e.g. "signature: …".
func describeFailure(err error) string {
	if ve := (*sandbox.VerifyError)(nil); errors.As(err, &ve) {
		return ve.Reason()
	}
	return err.Error()
}
