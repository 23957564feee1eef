package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// assessOptions are the flags of `sandboxd assess`.
type assessOptions struct {
	keys   verifyKeyFlags // pinned broker public keys
	bundle string         // the trusted bundle: the policy comes from it, never from the evidence
}

// Exit codes of `sandboxd assess`: exitOK (0) when every envelope verifies
// and is bound, every artifact used re-hashes, and the supervisor's
// recomputed assessments are byte-identical to the evidence's; exitFailed
// (1) when anything of that does not hold (the evidence is tampered,
// incomplete, about another bundle, or judged differently); exitUsage (2);
// exitBadInput (3) when the key, the bundle or the directory cannot be used
// at all (unreadable, not a key, a bundle that does not verify, no
// index.json).

// cmdAssess re-judges an evidence directory written by `sandboxd run
// --out`: it trusts only the pinned key and the bundle given, and prints the
// recomputed assessment JSON.
func cmdAssess(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o assessOptions
	fset := flag.NewFlagSet("assess", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Var(&o.keys, "key", "pinned broker public key `PEM` file (repeat for key rotation)")
	fset.StringVar(&o.bundle, "bundle", "", "the evaluator bundle `REF` (directory with bundle.json or OCI layout) whose policy judges the evidence")
	fset.Usage = func() {
		fmt.Fprintln(stderr, "usage: sandboxd assess --key PUB [--key PUB2] --bundle DIR|LAYOUT EVIDENCE_DIR")
		fset.PrintDefaults()
		fmt.Fprintln(stderr, "exit: 0 the evidence verifies and its assessment is reproduced byte for byte, 1 it does not, 3 bad input")
	}
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(o.keys) == 0 || o.bundle == "" || fset.NArg() != 1 {
		fset.Usage()
		return exitUsage
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sandboxd assess: "+format+"\n", a...)
		return exitBadInput
	}

	var pems [][]byte
	for _, p := range o.keys {
		b, err := os.ReadFile(p)
		if err != nil {
			return bad("--key: %v", err)
		}
		pems = append(pems, b)
	}
	keys, err := sandbox.ParseKeySet(pems...)
	if err != nil {
		return bad("--key: %v", err)
	}

	dir := fset.Arg(0)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return bad("evidence directory: %v", err)
	}
	defer root.Close()
	idxBytes, err := root.ReadFile("index.json")
	if err != nil {
		return bad("%s: not an evidence directory: %v", dir, err)
	}
	var idx evidenceIndex
	dec := json.NewDecoder(bytes.NewReader(idxBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&idx); err != nil {
		return bad("%s/index.json: %v", dir, err)
	}
	if idx.Schema != "sandboxd.evidence/v1" {
		return bad("%s/index.json: unknown schema %q", dir, idx.Schema)
	}

	tmp, err := os.MkdirTemp("", "sandboxd-assess-")
	if err != nil {
		return bad("%v", err)
	}
	defer os.RemoveAll(tmp)
	bun, cleanup, err := openBundle(ctx, o.bundle, tmp)
	defer cleanup()
	if err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}
	if err := bun.Verify(ctx); err != nil {
		return bad("bundle %s does not verify: %v", o.bundle, err)
	}
	policy, err := evaluate.PolicyOf(bun.Manifest)
	if err != nil {
		return bad("bundle %s: %v", o.bundle, err)
	}

	a := &assessor{root: root, keys: keys, idx: idx, bundle: bun, policy: policy}
	a.checkEvidence()
	if len(a.problems) > 0 {
		for _, p := range a.problems {
			fmt.Fprintf(stderr, "sandboxd assess: %s\n", p)
		}
		fmt.Fprintf(stderr, "sandboxd assess: %s: the evidence does not verify (%d problems); nothing was recomputed\n", dir, len(a.problems))
		return exitFailed
	}
	recomputed := a.recompute()
	if recomputed != nil {
		stdout.Write(recomputed)
		fmt.Fprintln(stdout)
	}
	for _, n := range a.notes {
		fmt.Fprintf(stderr, "sandboxd assess: note: %s\n", n)
	}
	if len(a.problems) > 0 {
		for _, p := range a.problems {
			fmt.Fprintf(stderr, "sandboxd assess: %s\n", p)
		}
		fmt.Fprintf(stderr, "sandboxd assess: %s: the recomputed assessment is not the evidence's (%d problems)\n", dir, len(a.problems))
		return exitFailed
	}
	fmt.Fprintf(stderr, "sandboxd assess: %s: %d envelopes verified; %s reproduced byte for byte (verdict %s)\n",
		dir, a.envelopes, idx.Assessment, a.verdict)
	return exitOK
}

// assessor holds one evidence directory while it is checked.
type assessor struct {
	root   *os.Root
	keys   sandbox.KeySet
	idx    evidenceIndex
	bundle *bundle.Bundle
	policy supervisor.Policy

	// evals are the evaluations found, by control kind ("" for the
	// candidate's own).
	evals     map[string]*evaluation
	reports   map[string][]byte // artifact digest → verified bytes
	envelopes int
	problems  []string
	notes     []string
	verdict   supervisor.Verdict
}

// evaluation is the candidate or grader jobs of one workspace, verified.
type evaluation struct {
	candidate, grader *verifiedJob
}

type verifiedJob struct {
	entry  evidenceJob
	job    sandbox.Job
	result sandbox.Result
}

func (a *assessor) problem(format string, args ...any) {
	a.problems = append(a.problems, fmt.Sprintf(format, args...))
}

// checkEvidence verifies every envelope against the pinned keys, binds each
// receipt and result to its job file and each result to its receipt, checks
// that the jobs are this bundle's, and re-hashes the artifacts.
func (a *assessor) checkEvidence() {
	m := a.bundle.Manifest
	if a.idx.BundleDigest != a.bundle.Digest {
		a.problem("index.json: the evidence is about bundle %s, --bundle is %s", a.idx.BundleDigest, a.bundle.Digest)
	}
	if a.idx.Image != m.Image {
		a.problem("index.json: the evidence names image %s, the bundle %s", a.idx.Image, m.Image)
	}
	named := map[string]bool{}
	a.evals = map[string]*evaluation{}
	listed := map[string]string{} // role → job id
	for _, e := range a.idx.Jobs {
		named[e.Receipt], named[e.Result] = true, true
		control, role, _ := strings.Cut(e.Role, "/")
		if role == "" {
			control, role = "", e.Role
		}
		if (control != "" && control != string(supervisor.ControlKnownGood) && control != string(supervisor.ControlKnownBad)) ||
			(role != "grader" && role != "candidate") {
			a.problem("index.json: job %s has an unknown role %q", e.ID, e.Role)
			continue
		}
		if id, dup := listed[e.Role]; dup {
			a.problem("index.json: two %s jobs (%s and %s)", e.Role, id, e.ID)
			continue
		}
		listed[e.Role] = e.ID
		vj := a.verifyJob(e)
		if vj == nil {
			continue
		}
		ev := a.evals[control]
		if ev == nil {
			ev = &evaluation{}
			a.evals[control] = ev
		}
		if role == "grader" {
			ev.grader = vj
		} else {
			ev.candidate = vj
		}
	}
	if listed["grader"] == "" {
		a.problem("index.json: no grader job of the candidate")
	}
	for _, control := range slices.Sorted(maps.Keys(a.evals)) {
		ev := a.evals[control]
		name := "the candidate's evaluation"
		graderRole := "grader"
		if control != "" {
			name = "control " + control
			graderRole = control + "/grader"
		}
		if ev.grader == nil {
			if listed[graderRole] == "" {
				a.problem("index.json: %s has no grader job", name)
			} // else: its failure to verify is reported
			continue
		}
		if (ev.candidate != nil) != (m.Candidate != nil) {
			a.problem("index.json: %s: the bundle declares a candidate command: %t; a candidate job is present: %t", name, m.Candidate != nil, ev.candidate != nil)
		}
		a.checkGrader(ev.grader)
		if ev.candidate != nil && m.Candidate != nil && !slices.Equal(ev.candidate.job.Argv, m.Candidate.Argv) {
			a.problem("%s: job %s ran %q, the bundle's candidate command is %q", ev.candidate.entry.Job, ev.candidate.job.ID, ev.candidate.job.Argv, m.Candidate.Argv)
		}
		if ev.candidate != nil && m.Candidate != nil {
			a.checkCandidate(ev.candidate)
		}
		if ev.candidate != nil {
			a.checkExport(ev.candidate, ev.grader)
		}
		if ev.candidate == nil {
			// Without a candidate job the grader grades the workspace itself.
			if in, ok := input(ev.grader.job, "candidate-export"); !ok || in.Writable {
				a.problem("%s: job %s was not given the candidate read-only", ev.grader.entry.Job, ev.grader.job.ID)
			}
		}
	}
	if ev := a.evals[""]; ev != nil && ev.grader != nil && ev.workspace() != a.idx.WorkspaceDigest {
		a.problem("index.json: workspace_digest is %s, the signed jobs were given %s", a.idx.WorkspaceDigest, ev.workspace())
	}

	// Every envelope in the directory is one the index names, and verifies.
	ents, err := fs.ReadDir(a.root.FS(), ".")
	if err != nil {
		a.problem("%v", err)
	}
	for _, ent := range ents {
		n := ent.Name()
		if !strings.HasSuffix(n, ".intoto.json") || named[n] || n == a.idx.Statement {
			continue
		}
		a.problem("%s: an envelope index.json does not name", n)
	}

	// Artifacts: every one the index lists re-hashes; the reports the
	// supervisor reads are kept.
	a.reports = map[string][]byte{}
	tried := map[string]bool{}
	for _, control := range slices.Sorted(maps.Keys(a.evals)) {
		ev := a.evals[control]
		if ev.grader == nil {
			continue
		}
		art, ok := ev.grader.result.Artifact(a.policy.ReportPath)
		if !ok || tried[art.Digest] {
			continue
		}
		tried[art.Digest] = true
		what := fmt.Sprintf("report artifact of job %s (%s)", ev.grader.job.ID, art.Path)
		if b, ok := a.rehash(artifactFile(art.Digest), art.Digest, art.Size, what, true); ok {
			a.reports[art.Digest] = b
		}
	}
	for _, d := range slices.Sorted(maps.Keys(a.idx.Artifacts)) {
		if tried[d] {
			continue
		}
		if f := a.idx.Artifacts[d]; f != artifactFile(d) {
			a.problem("index.json: artifact %s is filed as %q, not %q", d, f, artifactFile(d))
			continue
		}
		a.rehash(artifactFile(d), d, -1, "artifact", false)
	}
}

// verifyJob reads a job file, its receipt and its result, and verifies
// them against the pinned keys and each other.
func (a *assessor) verifyJob(e evidenceJob) *verifiedJob {
	data, err := a.root.ReadFile(e.Job)
	if err != nil {
		a.problem("job %s: %v", e.ID, err)
		return nil
	}
	job, err := sandbox.DecodeJob(data)
	if err != nil {
		a.problem("%s: %v", e.Job, err)
		return nil
	}
	if job.ID != e.ID || job.Digest != e.Digest {
		a.problem("%s: is job %q (%s); index.json says %q (%s)", e.Job, job.ID, job.Digest, e.ID, e.Digest)
		return nil
	}
	rcpt, err := a.root.ReadFile(e.Receipt)
	if err != nil {
		a.problem("job %s: receipt: %v", e.ID, err)
		return nil
	}
	r, err := sandbox.VerifyReceipt(a.keys, rcpt, job)
	if err != nil {
		a.problem("%s: %s", e.Receipt, describeFailure(err))
		return nil
	}
	a.envelopes++
	if r.Broker.EphemeralKey {
		a.note("the broker signed with an ephemeral key: the envelopes prove only that this directory is consistent with the key pinned")
	}
	renv, err := a.root.ReadFile(e.Result)
	if err != nil {
		a.problem("job %s: result: %v", e.ID, err)
		return nil
	}
	res, err := sandbox.VerifyResult(a.keys, renv, job, rcpt)
	if err != nil {
		a.problem("%s: %s", e.Result, describeFailure(err))
		return nil
	}
	a.envelopes++
	if string(res.Status) != e.Status {
		a.problem("index.json: job %s is %s, its signed result says %s", e.ID, e.Status, res.Status)
	}
	if job.Bundle != a.bundle.Digest || job.Image != a.bundle.Manifest.Image {
		a.problem("%s: job %s ran bundle %s on image %s, not --bundle's %s on %s", e.Job, e.ID, job.Bundle, job.Image, a.bundle.Digest, a.bundle.Manifest.Image)
		return nil
	}
	return &verifiedJob{entry: e, job: job, result: res}
}

func (a *assessor) note(n string) {
	if !slices.Contains(a.notes, n) {
		a.notes = append(a.notes, n)
	}
}

// checkGrader checks that a grader job is the bundle's grader: its command,
// the bundle layer mounted, and the report path it was told.
func (a *assessor) checkGrader(g *verifiedJob) {
	m := a.bundle.Manifest
	if !slices.Equal(g.job.Argv, m.Grader.Argv) {
		a.problem("%s: job %s ran %q, the bundle's grader is %q", g.entry.Job, g.job.ID, g.job.Argv, m.Grader.Argv)
	}
	if in, ok := input(g.job, "bundle"); !ok || in.Digest != a.bundle.LayerDigest || in.Writable {
		a.problem("%s: job %s was not given the bundle layer %s read-only", g.entry.Job, g.job.ID, a.bundle.LayerDigest)
	}
	if g.job.Env["SANDBOXD_REPORT"] != a.policy.ReportPath {
		a.problem("%s: job %s was told to write its report to %q, the bundle says %q", g.entry.Job, g.job.ID, g.job.Env["SANDBOXD_REPORT"], a.policy.ReportPath)
	}
	// And nothing else may differ: where the inputs are mounted, the rest
	// of the environment, the outputs, the limits. The export itself is
	// checked against the candidate job by checkExport.
	export, _ := input(g.job, "candidate-export")
	if err := evaluate.SameJob("grader", g.job, evaluate.GraderJob(m, a.bundle.Digest, a.bundle.LayerDigest, export.Digest, g.job.ID)); err != nil {
		a.problem("%s: %v", g.entry.Job, err)
	}
}

// checkCandidate checks that a candidate job is exactly the bundle's
// candidate command on the workspace it was given.
func (a *assessor) checkCandidate(c *verifiedJob) {
	ws, _ := input(c.job, "workspace")
	if err := evaluate.SameJob("candidate", c.job, evaluate.CandidateJob(a.bundle.Manifest, a.bundle.Digest, ws.Digest, c.job.ID)); err != nil {
		a.problem("%s: %v", c.entry.Job, err)
	}
}

func input(j sandbox.Job, name string) (sandbox.Input, bool) {
	for _, in := range j.Inputs {
		if in.Name == name {
			return in, true
		}
	}
	return sandbox.Input{}, false
}

// workspace is the digest of the workspace the evaluation judged: the
// candidate job's workspace, else what the grader was given to grade.
func (e *evaluation) workspace() string {
	if e.candidate != nil {
		in, _ := input(e.candidate.job, "workspace")
		return in.Digest
	}
	if e.grader == nil {
		return ""
	}
	in, _ := input(e.grader.job, "candidate-export")
	return in.Digest
}

func artifactFile(digest string) string {
	return "artifacts/" + strings.TrimPrefix(digest, "sha256:")
}

// rehash reads name and checks it against digest (and size, unless
// negative); keep returns the bytes.
func (a *assessor) rehash(name, digest string, size int64, what string, keep bool) ([]byte, bool) {
	f, err := a.root.Open(name)
	if err != nil {
		a.problem("%s: %s %s: %v", name, what, digest, err)
		return nil, false
	}
	defer f.Close()
	h := sha256.New()
	var buf bytes.Buffer
	w := io.Writer(h)
	if keep {
		w = io.MultiWriter(h, &buf)
	}
	// A tampered directory may hold a far larger file: never read past
	// the size the signed result gives (plus one byte to notice).
	var r io.Reader = f
	if size >= 0 {
		r = io.LimitReader(f, size+1)
	}
	n, err := io.Copy(w, r)
	if err != nil {
		a.problem("%s: %s: %v", name, what, err)
		return nil, false
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if got != digest {
		a.problem("%s: %s does not hash to %s: got %s (%d bytes)", name, what, digest, got, n)
		return nil, false
	}
	if size >= 0 && n != size {
		a.problem("%s: %s is %d bytes, the signed result says %d", name, what, n, size)
		return nil, false
	}
	return buf.Bytes(), true
}

// recompute runs the supervisor on the verified evidence: each control's
// evaluation, then the candidate's with the controls' outcomes, and
// compares every assessment and the signed statement with the evidence's.
// It returns the candidate's recomputed assessment.
func (a *assessor) recompute() []byte {
	var controls []supervisor.ControlOutcome
	files := map[string]string{}
	for _, c := range a.idx.Controls {
		if files[c.Kind] != "" {
			a.problem("index.json: control %s is listed twice", c.Kind)
		}
		files[c.Kind] = c.Assessment
	}
	for _, kind := range a.policy.Controls {
		ev := a.evals[string(kind)]
		if ev == nil {
			continue // the candidate's assessment then says the control is missing
		}
		cp := a.policy
		cp.Controls = nil
		as, raw, ok := a.assess(string(kind), ev, cp, nil)
		if !ok {
			continue
		}
		a.compare(files[string(kind)], raw, "control "+string(kind))
		controls = append(controls, supervisor.ControlFrom(kind, as, raw))
	}
	for _, kind := range slices.Sorted(maps.Keys(a.evals)) {
		if kind != "" && !slices.Contains(a.policy.Controls, supervisor.ControlKind(kind)) {
			a.problem("index.json: jobs of control %s, which the bundle does not declare", kind)
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(files)) {
		if a.evals[kind] == nil {
			a.problem("index.json: control %s is listed without its jobs", kind)
		}
	}
	as, raw, ok := a.assess("", a.evals[""], a.policy, controls)
	if !ok {
		return nil
	}
	a.verdict = as.Verdict
	a.compare(a.idx.Assessment, raw, "the candidate")
	if string(as.Verdict) != a.idx.Verdict {
		a.problem("index.json: verdict is %q, recomputed %q", a.idx.Verdict, as.Verdict)
	}
	a.checkStatement(as)
	return raw
}

// assess evaluates one evaluation with the supervisor.
func (a *assessor) assess(control string, ev *evaluation, p supervisor.Policy, controls []supervisor.ControlOutcome) (supervisor.Assessment, []byte, bool) {
	if ev == nil || ev.grader == nil {
		a.problem("no verified grader job for %q", control) // checkEvidence has said why
		return supervisor.Assessment{}, nil, false
	}
	e := supervisor.Evidence{
		BundleDigest:       a.bundle.Digest,
		ImageID:            a.bundle.Manifest.Image,
		CandidateJobDigest: ev.grader.job.Digest,
		WorkspaceDigest:    ev.workspace(),
		Policy:             p,
		Grader:             ev.grader.result,
		Controls:           controls,
	}
	if ev.candidate != nil {
		e.CandidateJobDigest = ev.candidate.job.Digest
		e.Candidate = &ev.candidate.result
	}
	if art, ok := ev.grader.result.Artifact(p.ReportPath); ok {
		if b, ok := a.reports[art.Digest]; ok {
			e.Report = bytes.NewReader(b)
		}
	}
	as, err := supervisor.Evaluate(e)
	if err == nil {
		var raw []byte
		if raw, err = as.CanonicalJSON(); err == nil {
			return as, raw, true
		}
	}
	name := "the candidate"
	if control != "" {
		name = "control " + control
	}
	a.problem("supervisor on %s: %v", name, err)
	return supervisor.Assessment{}, nil, false
}

// compare reports how the evidence's assessment file differs from the
// recomputed bytes.
func (a *assessor) compare(name string, recomputed []byte, what string) {
	if name == "" {
		a.problem("index.json: no assessment file for %s", what)
		return
	}
	old, err := a.root.ReadFile(name)
	if err != nil {
		a.problem("%s: %v", name, err)
		return
	}
	if bytes.Equal(old, recomputed) {
		return
	}
	var o, r any
	if err := json.Unmarshal(old, &o); err != nil {
		a.problem("%s: not JSON (%v), so not the recomputed assessment of %s", name, err, what)
		return
	}
	json.Unmarshal(recomputed, &r)
	diffs := jsonDiff("", o, r, nil)
	if len(diffs) == 0 {
		a.problem("%s: the same content as the recomputed assessment of %s, but not its canonical bytes", name, what)
		return
	}
	const max = 10
	for i, d := range diffs {
		if i == max {
			a.problem("%s: … and %d more differences", name, len(diffs)-max)
			break
		}
		a.problem("%s: %s", name, d)
	}
}

// jsonDiff lists where two decoded JSON values differ, as
// "PATH: the evidence says X, recomputed Y".
func jsonDiff(at string, old, re any, out []string) []string {
	label := at
	if label == "" {
		label = "(whole document)"
	}
	switch o := old.(type) {
	case map[string]any:
		r, ok := re.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range o {
			keys[k] = true
		}
		for k := range r {
			keys[k] = true
		}
		names := make([]string, 0, len(keys))
		for k := range keys {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			p := k
			if at != "" {
				p = at + "." + k
			}
			ov, inOld := o[k]
			rv, inRe := r[k]
			switch {
			case !inOld:
				out = append(out, fmt.Sprintf("%s: missing from the evidence, recomputed %s", p, shortJSON(compact(rv))))
			case !inRe:
				out = append(out, fmt.Sprintf("%s: in the evidence (%s), not recomputed", p, shortJSON(compact(ov))))
			default:
				out = jsonDiff(p, ov, rv, out)
			}
		}
		return out
	case []any:
		r, ok := re.([]any)
		if !ok || len(r) != len(o) {
			break
		}
		for i := range o {
			out = jsonDiff(fmt.Sprintf("%s[%d]", at, i), o[i], r[i], out)
		}
		return out
	default:
		if compact(old) == compact(re) {
			return out
		}
	}
	return append(out, fmt.Sprintf("%s: the evidence says %s, recomputed %s", label, shortJSON(compact(old)), shortJSON(compact(re))))
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func shortJSON(s string) string {
	if len(s) > 120 {
		return s[:117] + "..."
	}
	return s
}

// checkStatement checks the signed in-toto test-result statement against
// the recomputed assessment: present exactly when the verdict is passed or
// failed, signed by a pinned key, and carrying the recomputed statement.
func (a *assessor) checkStatement(as supervisor.Assessment) {
	want, err := as.StatementJSON()
	if errors.Is(err, supervisor.ErrInconclusive) {
		if a.idx.Statement != "" {
			a.problem("%s: a test-result statement for an inconclusive verdict", a.idx.Statement)
		}
		return
	}
	if err != nil {
		a.problem("test-result statement: %v", err)
		return
	}
	if a.idx.Statement == "" {
		a.problem("index.json: no signed test-result statement, though the verdict is %s", as.Verdict)
		return
	}
	env, err := a.root.ReadFile(a.idx.Statement)
	if err != nil {
		a.problem("%s: %v", a.idx.Statement, err)
		return
	}
	ve, err := sandbox.VerifyEnvelope(a.keys, env)
	if err != nil {
		a.problem("%s: %s", a.idx.Statement, describeFailure(err))
		return
	}
	if ve.PayloadType != sandbox.InTotoPayloadType {
		a.problem("%s: payload type %q, want %q", a.idx.Statement, ve.PayloadType, sandbox.InTotoPayloadType)
		return
	}
	a.envelopes++
	if !bytes.Equal(ve.Payload, want) {
		var o, r any
		json.Unmarshal(ve.Payload, &o)
		json.Unmarshal(want, &r)
		diffs := jsonDiff("", o, r, nil)
		if len(diffs) == 0 {
			diffs = []string{"not the recomputed statement's canonical bytes"}
		}
		for _, d := range diffs {
			a.problem("%s: %s", a.idx.Statement, d)
		}
	}
}

// checkExport checks that the grader was given exactly the candidate job's
// export, recomputed from the candidate's collected artifacts (re-hashed
// from the evidence directory) into a scratch store.
func (a *assessor) checkExport(c, g *verifiedJob) {
	in, ok := input(g.job, "candidate-export")
	if !ok || in.Writable {
		a.problem("%s: job %s was not given the candidate's export read-only", g.entry.Job, g.job.ID)
		return
	}
	dir, err := os.MkdirTemp("", "sandboxd-assess-")
	if err != nil {
		a.problem("scratch store: %v", err)
		return
	}
	defer os.RemoveAll(dir)
	st, err := store.Open(dir)
	if err != nil {
		a.problem("scratch store: %v", err)
		return
	}
	for _, art := range c.result.Artifacts {
		b, ok := a.rehash(artifactFile(art.Digest), art.Digest, art.Size, "artifact of job "+c.job.ID, true)
		if !ok {
			return
		}
		if _, err := st.PutBytes(b); err != nil {
			a.problem("scratch store: %v", err)
			return
		}
	}
	got, err := evaluate.ExportOf(context.Background(), st, c.result, c.job.Limits)
	if err != nil {
		a.problem("job %s: its export cannot be rebuilt: %v", c.job.ID, err)
		return
	}
	if got != in.Digest {
		a.problem("%s: job %s was given export %s, job %s exported %s", g.entry.Job, g.job.ID, in.Digest, c.job.ID, got)
	}
}
