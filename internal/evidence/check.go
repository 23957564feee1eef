package evidence

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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

// Dir is an evidence directory opened for checking.
type Dir struct {
	path  string
	root  *os.Root
	Index Index
}

// Open opens an evidence directory and reads its index.json. It never
// reads outside dir.
func Open(dir string) (*Dir, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("evidence directory: %w", err)
	}
	d := &Dir{path: dir, root: root}
	if err := d.readIndex(); err != nil {
		root.Close()
		return nil, err
	}
	return d, nil
}

func (d *Dir) readIndex() error {
	b, err := d.root.ReadFile("index.json")
	if err != nil {
		return fmt.Errorf("%s: not an evidence directory: %w", d.path, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d.Index); err != nil {
		return fmt.Errorf("%s/index.json: %w", d.path, err)
	}
	if d.Index.Schema != Schema {
		return fmt.Errorf("%s/index.json: unknown schema %q: %w", d.path, d.Index.Schema, sandbox.ErrInvalid)
	}
	return nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Report is what Check found.
type Report struct {
	// Recomputed is false when the evidence did not verify, so that
	// nothing was recomputed from it.
	Recomputed bool
	// Assessment is the candidate's recomputed assessment (nil when none
	// could be), and Verdict its verdict.
	Assessment []byte
	Verdict    supervisor.Verdict
	// Envelopes counts the envelopes verified.
	Envelopes int
	// Problems are why the evidence does not hold, each naming the file;
	// none when it holds. Notes are what holds but should be known.
	Problems []string
	Notes    []string
}

// Check verifies the directory against the pinned keys and the bundle (one
// that verified), then recomputes every assessment with the supervisor and
// compares them with the directory's. The error is for a bundle whose
// policy cannot be used; everything about the evidence is a problem in the
// report.
func (d *Dir) Check(ctx context.Context, keys sandbox.KeySet, b *bundle.Bundle) (*Report, error) {
	e, err := evaluate.Of(b, "")
	if err != nil {
		return nil, err
	}
	a := &checker{ctx: ctx, root: d.root, keys: keys, idx: d.Index, bundle: b, eval: e, policy: e.Policy}
	tmp, err := os.MkdirTemp("", "sandboxd-assess-")
	if err != nil {
		return nil, fmt.Errorf("scratch store: %w", err)
	}
	defer os.RemoveAll(tmp)
	if a.scratch, err = store.Open(tmp); err != nil {
		return nil, fmt.Errorf("scratch store: %w", err)
	}
	a.checkEvidence()
	rep := &Report{}
	if len(a.problems) == 0 {
		rep.Recomputed = true
		rep.Assessment = a.recompute()
	}
	rep.Verdict, rep.Envelopes, rep.Problems, rep.Notes = a.verdict, a.envelopes, a.problems, a.notes
	return rep, nil
}

// checker holds one evidence directory while it is checked.
type checker struct {
	ctx    context.Context
	root   *os.Root
	keys   sandbox.KeySet
	idx    Index
	bundle *bundle.Bundle
	// eval is what the bundle prescribes; the evidence's jobs must be
	// its jobs, and their results are judged by it again.
	eval   *evaluate.Evaluation
	policy supervisor.Policy
	// scratch holds the verified artifacts the checks rebuild from.
	scratch *store.Store

	// evals are the evaluations found, by control kind ("" for the
	// candidate's own).
	evals     map[string]*evaluation
	envelopes int
	problems  []string
	notes     []string
	verdict   supervisor.Verdict
}

// evaluation is the candidate or grader jobs of one workspace, verified.
type evaluation struct {
	candidate, grader *verifiedJob
	// exportRefused is the reader rules' word on the candidate's export,
	// rebuilt by checkExport.
	exportRefused string
}

type verifiedJob struct {
	entry  Job
	job    sandbox.Job
	result sandbox.Result
}

func (a *checker) problem(format string, args ...any) {
	a.problems = append(a.problems, fmt.Sprintf(format, args...))
}

// checkEvidence verifies every envelope against the pinned keys, binds each
// receipt and result to its job file and each result to its receipt, checks
// that the jobs are this bundle's, and re-hashes the artifacts.
func (a *checker) checkEvidence() {
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
	runID := ""                   // the run all jobs are of
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
		// The role is the signed job's, never the index's: the index only
		// says where its files are.
		run, signedControl, signedRole, ok := evaluate.ParseJobID(vj.job.ID)
		if !ok {
			a.problem("index.json: job %s is listed as the %s job; its signed id is not that of a job of a run", e.ID, e.Role)
			continue
		}
		if signed := evaluate.Role(signedControl, signedRole); signed != e.Role {
			a.problem("index.json: job %s is listed as the %s job; its signed id makes it the %s job of run %s", e.ID, e.Role, signed, run)
			continue
		}
		if runID == "" {
			runID = run
		} else if run != runID {
			a.problem("%s: job %s is of run %s, not of run %s like the other jobs", e.Job, e.ID, run, runID)
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
			a.checkExport(ev)
		}
		if ev.candidate == nil {
			// Without a candidate job the grader grades the workspace itself.
			if in, ok := input(ev.grader.job, "candidate-export"); !ok || in.Writable {
				a.problem("%s: job %s was not given the candidate read-only", ev.grader.entry.Job, ev.grader.job.ID)
			}
		}
		if control != "" && slices.Contains(a.policy.Controls, supervisor.ControlKind(control)) {
			a.checkControlWorkspace(supervisor.ControlKind(control), ev)
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
	// supervisor reads are kept in the scratch store.
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
			a.keep(b)
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
func (a *checker) verifyJob(e Job) *verifiedJob {
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
		a.problem("%s: %s", e.Receipt, describe(err))
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
		a.problem("%s: %s", e.Result, describe(err))
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

func (a *checker) note(n string) {
	if !slices.Contains(a.notes, n) {
		a.notes = append(a.notes, n)
	}
}

// checkGrader checks that a grader job is the bundle's grader: its command,
// the bundle layer mounted, and the report path it was told.
func (a *checker) checkGrader(g *verifiedJob) {
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
	if err := evaluate.SameJob("grader", g.job, a.eval.On(g.job.Runtime).GraderJob(export.Digest, g.job.ID)); err != nil {
		a.problem("%s: %v", g.entry.Job, err)
	}
}

// checkControlWorkspace checks that a control's evaluation judged the
// control's own workspace, recomputed from the bundle's layer.
func (a *checker) checkControlWorkspace(kind supervisor.ControlKind, ev *evaluation) {
	want, err := a.eval.ControlWorkspace(a.ctx, a.scratch, kind)
	if err != nil {
		a.problem("control %s: its workspace cannot be rebuilt from the bundle: %v", kind, err)
		return
	}
	if got := ev.workspace(); got != want {
		j := ev.grader
		if ev.candidate != nil {
			j = ev.candidate
		}
		a.problem("%s: job %s of control %s judged workspace %s; the bundle's %s is %s", j.entry.Job, j.job.ID, kind, got, evaluate.ControlDir(a.bundle.Manifest, kind), want)
	}
}

// checkCandidate checks that a candidate job is exactly the bundle's
// candidate command on the workspace it was given.
func (a *checker) checkCandidate(c *verifiedJob) {
	ws, _ := input(c.job, "workspace")
	if err := evaluate.SameJob("candidate", c.job, a.eval.On(c.job.Runtime).CandidateJob(ws.Digest, c.job.ID)); err != nil {
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

// rehash reads name and checks it against digest (and size, unless
// negative); keep returns the bytes.
func (a *checker) rehash(name, digest string, size int64, what string, keep bool) ([]byte, bool) {
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
func (a *checker) recompute() []byte {
	files := map[string]string{}
	verdicts := map[string]string{}
	for _, c := range a.idx.Controls {
		if files[c.Kind] != "" {
			a.problem("index.json: control %s is listed twice", c.Kind)
		}
		files[c.Kind], verdicts[c.Kind] = c.Assessment, c.Verdict
	}
	controls := map[supervisor.ControlKind]evaluate.Results{}
	for kind, ev := range a.evals {
		if kind != "" {
			j, err := ev.judged()
			if err != nil {
				a.problem("control %s: %v", kind, err)
				return nil
			}
			controls[supervisor.ControlKind(kind)] = j
		}
	}
	cand := a.evals[""]
	if cand == nil || cand.grader == nil {
		a.problem("no verified grader job of the candidate") // checkEvidence has said why
		return nil
	}
	candJudged, err := cand.judged()
	if err != nil {
		a.problem("candidate: %v", err)
		return nil
	}
	runs, as, raw, err := a.eval.Judge(a.scratch, controls, candJudged, judge)
	if err != nil {
		a.problem("supervisor: %v", err)
		return nil
	}
	for _, r := range runs {
		a.compare(files[string(r.Kind)], r.AssessmentJSON, "control "+string(r.Kind))
		if v := verdicts[string(r.Kind)]; files[string(r.Kind)] != "" && v != string(r.Assessment.Verdict) {
			a.problem("index.json: control %s verdict is %q, recomputed %q", r.Kind, v, r.Assessment.Verdict)
		}
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
	a.verdict = as.Verdict
	a.compare(a.idx.Assessment, raw, "the candidate")
	if string(as.Verdict) != a.idx.Verdict {
		a.problem("index.json: verdict is %q, recomputed %q", a.idx.Verdict, as.Verdict)
	}
	a.checkStatement(as)
	return raw
}

// judge is the supervisor's judgement without retaining it: a re-check
// keeps nothing.
func judge(ev supervisor.Evidence) (supervisor.Assessment, []byte, error) {
	as, err := supervisor.Judge(ev)
	if err != nil {
		return supervisor.Assessment{}, nil, err
	}
	raw, err := as.CanonicalJSON()
	return as, raw, err
}

// judged is the evaluation's results as the supervisor judges them; an
// evaluation without a verified grader job has nothing to judge.
func (e *evaluation) judged() (evaluate.Results, error) {
	if e.grader == nil {
		return evaluate.Results{}, errors.New("no verified grader job")
	}
	j := evaluate.Results{Workspace: e.workspace(), Grader: e.grader.result}
	if e.candidate != nil {
		j.Candidate, j.ExportRefused = &e.candidate.result, e.exportRefused
	}
	return j, nil
}

// keep puts verified bytes into the scratch store.
func (a *checker) keep(b []byte) bool {
	if _, err := a.scratch.PutBytes(b); err != nil {
		a.problem("scratch store: %v", err)
		return false
	}
	return true
}

// compare reports how the evidence's assessment file differs from the
// recomputed bytes.
func (a *checker) compare(name string, recomputed []byte, what string) {
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
func (a *checker) checkStatement(as supervisor.Assessment) {
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
		a.problem("%s: %s", a.idx.Statement, describe(err))
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
// from the evidence directory) into a scratch store, and keeps the reader
// rules' word on it for the supervisor.
func (a *checker) checkExport(ev *evaluation) {
	c, g := ev.candidate, ev.grader
	in, ok := input(g.job, "candidate-export")
	if !ok || in.Writable {
		a.problem("%s: job %s was not given the candidate's export read-only", g.entry.Job, g.job.ID)
		return
	}
	for _, art := range c.result.Artifacts {
		b, ok := a.rehash(artifactFile(art.Digest), art.Digest, art.Size, "artifact of job "+c.job.ID, true)
		if !ok || !a.keep(b) {
			return
		}
	}
	x, err := a.eval.Handover(a.ctx, a.scratch, c.result)
	if err != nil {
		a.problem("job %s: its export cannot be rebuilt: %v", c.job.ID, err)
		return
	}
	if x.Digest != in.Digest {
		a.problem("%s: job %s was given export %s, job %s exported %s", g.entry.Job, g.job.ID, in.Digest, c.job.ID, x.Digest)
	}
	ev.exportRefused = x.Refused
}

// describe leads with the check that failed, e.g. "signature: …".
func describe(err error) string {
	if ve := (*sandbox.VerifyError)(nil); errors.As(err, &ve) {
		return ve.Reason()
	}
	return err.Error()
}
