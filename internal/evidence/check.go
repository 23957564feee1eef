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
	ck := &checker{ctx: ctx, root: d.root, keys: keys, idx: d.Index, bundle: b, eval: e, policy: e.Policy}
	tmp, err := os.MkdirTemp("", "sandboxd-assess-")
	if err != nil {
		return nil, fmt.Errorf("scratch store: %w", err)
	}
	defer os.RemoveAll(tmp)
	if ck.scratch, err = store.Open(tmp); err != nil {
		return nil, fmt.Errorf("scratch store: %w", err)
	}
	ck.checkEvidence()
	rep := &Report{}
	if len(ck.problems) == 0 {
		rep.Recomputed = true
		rep.Assessment = ck.recompute()
	}
	rep.Verdict, rep.Envelopes, rep.Problems, rep.Notes = ck.verdict, ck.envelopes, ck.problems, ck.notes
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

func (ck *checker) problem(format string, args ...any) {
	ck.problems = append(ck.problems, fmt.Sprintf(format, args...))
}

// checkEvidence verifies every envelope against the pinned keys, binds each
// receipt and result to its job file and each result to its receipt, checks
// that the jobs are this bundle's, and re-hashes the artifacts.
func (ck *checker) checkEvidence() {
	m := ck.bundle.Manifest
	if ck.idx.BundleDigest != ck.bundle.Digest {
		ck.problem("index.json: the evidence is about bundle %s, --bundle is %s", ck.idx.BundleDigest, ck.bundle.Digest)
	}
	if ck.idx.Image != m.Image {
		ck.problem("index.json: the evidence names image %s, the bundle %s", ck.idx.Image, m.Image)
	}
	named := map[string]bool{}
	ck.evals = map[string]*evaluation{}
	listed := map[string]string{} // role → job id
	runID := ""                   // the run all jobs are of
	for _, e := range ck.idx.Jobs {
		named[e.Receipt], named[e.Result] = true, true
		control, role, _ := strings.Cut(e.Role, "/")
		if role == "" {
			control, role = "", e.Role
		}
		if (control != "" && control != string(supervisor.ControlKnownGood) && control != string(supervisor.ControlKnownBad)) ||
			(role != "grader" && role != "candidate") {
			ck.problem("index.json: job %s has an unknown role %q", e.ID, e.Role)
			continue
		}
		if id, dup := listed[e.Role]; dup {
			ck.problem("index.json: two %s jobs (%s and %s)", e.Role, id, e.ID)
			continue
		}
		listed[e.Role] = e.ID
		vj := ck.verifyJob(e)
		if vj == nil {
			continue
		}
		// The role is the signed job's, never the index's: the index only
		// says where its files are.
		run, signedControl, signedRole, ok := evaluate.ParseJobID(vj.job.ID)
		if !ok {
			ck.problem("index.json: job %s is listed as the %s job; its signed id is not that of a job of a run", e.ID, e.Role)
			continue
		}
		if signed := evaluate.Role(signedControl, signedRole); signed != e.Role {
			ck.problem("index.json: job %s is listed as the %s job; its signed id makes it the %s job of run %s", e.ID, e.Role, signed, run)
			continue
		}
		if runID == "" {
			runID = run
		} else if run != runID {
			ck.problem("%s: job %s is of run %s, not of run %s like the other jobs", e.Job, e.ID, run, runID)
			continue
		}
		ev := ck.evals[control]
		if ev == nil {
			ev = &evaluation{}
			ck.evals[control] = ev
		}
		if role == "grader" {
			ev.grader = vj
		} else {
			ev.candidate = vj
		}
	}
	if listed["grader"] == "" {
		ck.problem("index.json: no grader job of the candidate")
	}
	for _, control := range slices.Sorted(maps.Keys(ck.evals)) {
		ev := ck.evals[control]
		name := "the candidate's evaluation"
		graderRole := "grader"
		if control != "" {
			name = "control " + control
			graderRole = control + "/grader"
		}
		if ev.grader == nil {
			if listed[graderRole] == "" {
				ck.problem("index.json: %s has no grader job", name)
			} // else: its failure to verify is reported
			continue
		}
		if (ev.candidate != nil) != (m.Candidate != nil) {
			ck.problem("index.json: %s: the bundle declares a candidate command: %t; a candidate job is present: %t", name, m.Candidate != nil, ev.candidate != nil)
		}
		ck.checkGrader(ev.grader)
		if ev.candidate != nil && m.Candidate != nil && !slices.Equal(ev.candidate.job.Argv, m.Candidate.Argv) {
			ck.problem("%s: job %s ran %q, the bundle's candidate command is %q", ev.candidate.entry.Job, ev.candidate.job.ID, ev.candidate.job.Argv, m.Candidate.Argv)
		}
		if ev.candidate != nil && m.Candidate != nil {
			ck.checkCandidate(ev.candidate)
		}
		if ev.candidate != nil {
			ck.checkExport(ev)
		}
		if ev.candidate == nil {
			// Without a candidate job the grader grades the workspace itself.
			if in, ok := input(ev.grader.job, "candidate-export"); !ok || in.Writable {
				ck.problem("%s: job %s was not given the candidate read-only", ev.grader.entry.Job, ev.grader.job.ID)
			}
		}
		if control != "" && slices.Contains(ck.policy.Controls, supervisor.ControlKind(control)) {
			ck.checkControlWorkspace(supervisor.ControlKind(control), ev)
		}
	}
	if ev := ck.evals[""]; ev != nil && ev.grader != nil && ev.workspace() != ck.idx.WorkspaceDigest {
		ck.problem("index.json: workspace_digest is %s, the signed jobs were given %s", ck.idx.WorkspaceDigest, ev.workspace())
	}

	// Every envelope in the directory is one the index names, and verifies.
	ents, err := fs.ReadDir(ck.root.FS(), ".")
	if err != nil {
		ck.problem("%v", err)
	}
	for _, ent := range ents {
		n := ent.Name()
		if !strings.HasSuffix(n, ".intoto.json") || named[n] || n == ck.idx.Statement {
			continue
		}
		ck.problem("%s: an envelope index.json does not name", n)
	}

	// Artifacts: every one the index lists re-hashes; the reports the
	// supervisor reads are kept in the scratch store.
	tried := map[string]bool{}
	for _, control := range slices.Sorted(maps.Keys(ck.evals)) {
		ev := ck.evals[control]
		if ev.grader == nil {
			continue
		}
		art, ok := ev.grader.result.Artifact(ck.policy.ReportPath)
		if !ok || tried[art.Digest] {
			continue
		}
		tried[art.Digest] = true
		what := fmt.Sprintf("report artifact of job %s (%s)", ev.grader.job.ID, art.Path)
		if b, ok := ck.rehash(artifactFile(art.Digest), art.Digest, art.Size, what, true); ok {
			ck.keep(b)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(ck.idx.Artifacts)) {
		if tried[d] {
			continue
		}
		if f := ck.idx.Artifacts[d]; f != artifactFile(d) {
			ck.problem("index.json: artifact %s is filed as %q, not %q", d, f, artifactFile(d))
			continue
		}
		ck.rehash(artifactFile(d), d, -1, "artifact", false)
	}
}

// verifyJob reads a job file, its receipt and its result, and verifies
// them against the pinned keys and each other.
func (ck *checker) verifyJob(e Job) *verifiedJob {
	data, err := ck.root.ReadFile(e.Job)
	if err != nil {
		ck.problem("job %s: %v", e.ID, err)
		return nil
	}
	job, err := sandbox.DecodeJob(data)
	if err != nil {
		ck.problem("%s: %v", e.Job, err)
		return nil
	}
	if job.ID != e.ID || job.Digest != e.Digest {
		ck.problem("%s: is job %q (%s); index.json says %q (%s)", e.Job, job.ID, job.Digest, e.ID, e.Digest)
		return nil
	}
	rcpt, err := ck.root.ReadFile(e.Receipt)
	if err != nil {
		ck.problem("job %s: receipt: %v", e.ID, err)
		return nil
	}
	r, err := sandbox.VerifyReceipt(ck.keys, rcpt, job)
	if err != nil {
		ck.problem("%s: %s", e.Receipt, describe(err))
		return nil
	}
	ck.envelopes++
	if r.Broker.EphemeralKey {
		ck.note("the broker signed with an ephemeral key: the envelopes prove only that this directory is consistent with the key pinned")
	}
	renv, err := ck.root.ReadFile(e.Result)
	if err != nil {
		ck.problem("job %s: result: %v", e.ID, err)
		return nil
	}
	res, err := sandbox.VerifyResult(ck.keys, renv, job, rcpt)
	if err != nil {
		ck.problem("%s: %s", e.Result, describe(err))
		return nil
	}
	ck.envelopes++
	if string(res.Status) != e.Status {
		ck.problem("index.json: job %s is %s, its signed result says %s", e.ID, e.Status, res.Status)
	}
	if job.Bundle != ck.bundle.Digest || job.Image != ck.bundle.Manifest.Image {
		ck.problem("%s: job %s ran bundle %s on image %s, not --bundle's %s on %s", e.Job, e.ID, job.Bundle, job.Image, ck.bundle.Digest, ck.bundle.Manifest.Image)
		return nil
	}
	return &verifiedJob{entry: e, job: job, result: res}
}

func (ck *checker) note(n string) {
	if !slices.Contains(ck.notes, n) {
		ck.notes = append(ck.notes, n)
	}
}

// checkGrader checks that a grader job is the bundle's grader: its command,
// the bundle layer mounted, and the report path it was told.
func (ck *checker) checkGrader(g *verifiedJob) {
	m := ck.bundle.Manifest
	if !slices.Equal(g.job.Argv, m.Grader.Argv) {
		ck.problem("%s: job %s ran %q, the bundle's grader is %q", g.entry.Job, g.job.ID, g.job.Argv, m.Grader.Argv)
	}
	if in, ok := input(g.job, "bundle"); !ok || in.Digest != ck.bundle.LayerDigest || in.Writable {
		ck.problem("%s: job %s was not given the bundle layer %s read-only", g.entry.Job, g.job.ID, ck.bundle.LayerDigest)
	}
	if g.job.Env["SANDBOXD_REPORT"] != ck.policy.ReportPath {
		ck.problem("%s: job %s was told to write its report to %q, the bundle says %q", g.entry.Job, g.job.ID, g.job.Env["SANDBOXD_REPORT"], ck.policy.ReportPath)
	}
	// And nothing else may differ: where the inputs are mounted, the rest
	// of the environment, the outputs, the limits. The export itself is
	// checked against the candidate job by checkExport.
	export, _ := input(g.job, "candidate-export")
	if err := evaluate.SameJob("grader", g.job, ck.eval.On(g.job.Runtime).GraderJob(export.Digest, g.job.ID)); err != nil {
		ck.problem("%s: %v", g.entry.Job, err)
	}
}

// checkControlWorkspace checks that a control's evaluation judged the
// control's own workspace, recomputed from the bundle's layer.
func (ck *checker) checkControlWorkspace(kind supervisor.ControlKind, ev *evaluation) {
	want, err := ck.eval.ControlWorkspace(ck.ctx, ck.scratch, kind)
	if err != nil {
		ck.problem("control %s: its workspace cannot be rebuilt from the bundle: %v", kind, err)
		return
	}
	if got := ev.workspace(); got != want {
		j := ev.grader
		if ev.candidate != nil {
			j = ev.candidate
		}
		ck.problem("%s: job %s of control %s judged workspace %s; the bundle's %s is %s", j.entry.Job, j.job.ID, kind, got, evaluate.ControlDir(ck.bundle.Manifest, kind), want)
	}
}

// checkCandidate checks that a candidate job is exactly the bundle's
// candidate command on the workspace it was given.
func (ck *checker) checkCandidate(c *verifiedJob) {
	ws, _ := input(c.job, "workspace")
	if err := evaluate.SameJob("candidate", c.job, ck.eval.On(c.job.Runtime).CandidateJob(ws.Digest, c.job.ID)); err != nil {
		ck.problem("%s: %v", c.entry.Job, err)
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
func (ck *checker) rehash(name, digest string, size int64, what string, keep bool) ([]byte, bool) {
	f, err := ck.root.Open(name)
	if err != nil {
		ck.problem("%s: %s %s: %v", name, what, digest, err)
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
		ck.problem("%s: %s: %v", name, what, err)
		return nil, false
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if got != digest {
		ck.problem("%s: %s does not hash to %s: got %s (%d bytes)", name, what, digest, got, n)
		return nil, false
	}
	if size >= 0 && n != size {
		ck.problem("%s: %s is %d bytes, the signed result says %d", name, what, n, size)
		return nil, false
	}
	return buf.Bytes(), true
}

// recompute runs the supervisor on the verified evidence: each control's
// evaluation, then the candidate's with the controls' outcomes, and
// compares every assessment and the signed statement with the evidence's.
// It returns the candidate's recomputed assessment.
func (ck *checker) recompute() []byte {
	files := map[string]string{}
	verdicts := map[string]string{}
	for _, c := range ck.idx.Controls {
		if files[c.Kind] != "" {
			ck.problem("index.json: control %s is listed twice", c.Kind)
		}
		files[c.Kind], verdicts[c.Kind] = c.Assessment, c.Verdict
	}
	controls := map[supervisor.ControlKind]evaluate.Results{}
	for kind, ev := range ck.evals {
		if kind != "" {
			j, err := ev.judged()
			if err != nil {
				ck.problem("control %s: %v", kind, err)
				return nil
			}
			controls[supervisor.ControlKind(kind)] = j
		}
	}
	cand := ck.evals[""]
	if cand == nil || cand.grader == nil {
		ck.problem("no verified grader job of the candidate") // checkEvidence has said why
		return nil
	}
	candJudged, err := cand.judged()
	if err != nil {
		ck.problem("candidate: %v", err)
		return nil
	}
	runs, as, raw, err := ck.eval.Judge(ck.scratch, controls, candJudged, judge)
	if err != nil {
		ck.problem("supervisor: %v", err)
		return nil
	}
	for _, r := range runs {
		ck.compare(files[string(r.Kind)], r.AssessmentJSON, "control "+string(r.Kind))
		if v := verdicts[string(r.Kind)]; files[string(r.Kind)] != "" && v != string(r.Assessment.Verdict) {
			ck.problem("index.json: control %s verdict is %q, recomputed %q", r.Kind, v, r.Assessment.Verdict)
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(ck.evals)) {
		if kind != "" && !slices.Contains(ck.policy.Controls, supervisor.ControlKind(kind)) {
			ck.problem("index.json: jobs of control %s, which the bundle does not declare", kind)
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(files)) {
		if ck.evals[kind] == nil {
			ck.problem("index.json: control %s is listed without its jobs", kind)
		}
	}
	ck.verdict = as.Verdict
	ck.compare(ck.idx.Assessment, raw, "the candidate")
	if string(as.Verdict) != ck.idx.Verdict {
		ck.problem("index.json: verdict is %q, recomputed %q", ck.idx.Verdict, as.Verdict)
	}
	ck.checkStatement(as)
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
func (ck *checker) keep(b []byte) bool {
	if _, err := ck.scratch.PutBytes(b); err != nil {
		ck.problem("scratch store: %v", err)
		return false
	}
	return true
}

// compare reports how the evidence's assessment file differs from the
// recomputed bytes.
func (ck *checker) compare(name string, recomputed []byte, what string) {
	if name == "" {
		ck.problem("index.json: no assessment file for %s", what)
		return
	}
	old, err := ck.root.ReadFile(name)
	if err != nil {
		ck.problem("%s: %v", name, err)
		return
	}
	if bytes.Equal(old, recomputed) {
		return
	}
	var o, r any
	if err := json.Unmarshal(old, &o); err != nil {
		ck.problem("%s: not JSON (%v), so not the recomputed assessment of %s", name, err, what)
		return
	}
	json.Unmarshal(recomputed, &r)
	diffs := jsonDiff("", o, r, nil)
	if len(diffs) == 0 {
		ck.problem("%s: the same content as the recomputed assessment of %s, but not its canonical bytes", name, what)
		return
	}
	const max = 10
	for i, d := range diffs {
		if i == max {
			ck.problem("%s: … and %d more differences", name, len(diffs)-max)
			break
		}
		ck.problem("%s: %s", name, d)
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
func (ck *checker) checkStatement(as supervisor.Assessment) {
	want, err := as.StatementJSON()
	if errors.Is(err, supervisor.ErrInconclusive) {
		if ck.idx.Statement != "" {
			ck.problem("%s: a test-result statement for an inconclusive verdict", ck.idx.Statement)
		}
		return
	}
	if err != nil {
		ck.problem("test-result statement: %v", err)
		return
	}
	if ck.idx.Statement == "" {
		ck.problem("index.json: no signed test-result statement, though the verdict is %s", as.Verdict)
		return
	}
	env, err := ck.root.ReadFile(ck.idx.Statement)
	if err != nil {
		ck.problem("%s: %v", ck.idx.Statement, err)
		return
	}
	ve, err := sandbox.VerifyEnvelope(ck.keys, env)
	if err != nil {
		ck.problem("%s: %s", ck.idx.Statement, describe(err))
		return
	}
	if ve.PayloadType != sandbox.InTotoPayloadType {
		ck.problem("%s: payload type %q, want %q", ck.idx.Statement, ve.PayloadType, sandbox.InTotoPayloadType)
		return
	}
	ck.envelopes++
	if !bytes.Equal(ve.Payload, want) {
		var o, r any
		json.Unmarshal(ve.Payload, &o)
		json.Unmarshal(want, &r)
		diffs := jsonDiff("", o, r, nil)
		if len(diffs) == 0 {
			diffs = []string{"not the recomputed statement's canonical bytes"}
		}
		for _, d := range diffs {
			ck.problem("%s: %s", ck.idx.Statement, d)
		}
	}
}

// checkExport checks that the grader was given exactly the candidate job's
// export, recomputed from the candidate's collected artifacts (re-hashed
// from the evidence directory) into a scratch store, and keeps the reader
// rules' word on it for the supervisor.
func (ck *checker) checkExport(ev *evaluation) {
	c, g := ev.candidate, ev.grader
	in, ok := input(g.job, "candidate-export")
	if !ok || in.Writable {
		ck.problem("%s: job %s was not given the candidate's export read-only", g.entry.Job, g.job.ID)
		return
	}
	for _, art := range c.result.Artifacts {
		b, ok := ck.rehash(artifactFile(art.Digest), art.Digest, art.Size, "artifact of job "+c.job.ID, true)
		if !ok || !ck.keep(b) {
			return
		}
	}
	x, err := ck.eval.Handover(ck.ctx, ck.scratch, c.result)
	if err != nil {
		ck.problem("job %s: its export cannot be rebuilt: %v", c.job.ID, err)
		return
	}
	if x.Digest != in.Digest {
		ck.problem("%s: job %s was given export %s, job %s exported %s", g.entry.Job, g.job.ID, in.Digest, c.job.ID, x.Digest)
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
