package sandbox

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// JobSchema is the only job schema version this release accepts.
const JobSchema = "sandboxd.job/v1"

// Fixed paths inside every sandbox. Jobs place inputs and outputs relative
// to these; nothing else on the container's filesystem is writable.
const (
	// WorkPath is the size-bounded scratch space (tmpfs) where writable
	// inputs are copied and the candidate's working directory lives.
	WorkPath = "/work"
	// TmpPath is a second size-bounded tmpfs for temporary files, root's
	// with the candidate's group, closed to the code uid's writes.
	TmpPath = "/tmp"
	// CodeTmpPath is the code uid's own size-bounded tmpfs, its $TMPDIR:
	// programs a grader runs through the helper's exec service write
	// there, never in the grader's scratch space.
	CodeTmpPath = "/.code-tmp"
	// BundlePath is where a job's evaluator bundle is mounted read-only.
	BundlePath = "/bundle"
	// InputsPath is the parent of every other read-only input.
	InputsPath = "/inputs"
	// CandidateExportPath is where a grader job sees the candidate's export.
	CandidateExportPath = "/inputs/candidate-export"
)

// Network modes. v1 has exactly one.
const NetworkNone = "none"

// Runtimes a job may ask for. runsc is used only where the operator allows it.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
)

// Job is a sealed, immutable unit of work: one command run once in a fresh
// sandbox. Its Digest binds every field; the ID is reserved by the caller.
type Job struct {
	Schema string `json:"schema"`
	// ID is the caller-reserved identity of the job (1-128 of [A-Za-z0-9._-]).
	ID string `json:"id"`
	// Digest is the SHA-256 of the job's canonical JSON without this field.
	Digest string `json:"digest,omitempty"`
	// Image is the evaluator image, by local image ID ("sha256:…") only.
	Image string `json:"image"`
	// Bundle is the digest of the evaluator bundle this job runs for, if any.
	// The bundle's files themselves reach the job as an Input at BundlePath.
	Bundle string `json:"bundle,omitempty"`
	// Inputs are file trees placed in the sandbox before the command runs.
	Inputs []Input `json:"inputs"`
	// Argv is the command, run directly (no shell is added).
	Argv []string `json:"argv"`
	// Env is exactly the environment the command sees, besides PATH, HOME
	// and HOSTNAME, which the broker sets unless Env sets PATH or HOME.
	Env map[string]string `json:"env"`
	// WorkDir is the command's working directory.
	WorkDir string `json:"workdir"`
	// Outputs are directories (under WorkPath or TmpPath) whose regular
	// files are collected as artifacts when the command ends.
	Outputs []string `json:"outputs"`
	Limits  Limits   `json:"limits"`
	Network string   `json:"network"`
	Runtime string   `json:"runtime"`
}

// Input is one file tree given to a job: a tar blob named by its digest.
type Input struct {
	// Name identifies the input within the job (1-64 of [a-z0-9-]).
	Name string `json:"name"`
	// Digest is the SHA-256 of the input's tar stream.
	Digest string `json:"digest"`
	// Path is where the tree appears in the sandbox. Read-only inputs sit at
	// BundlePath or under InputsPath; writable copies at or under WorkPath.
	Path string `json:"path"`
	// Writable asks for a private, writable copy in scratch space instead of
	// a read-only mount.
	Writable bool `json:"writable"`
}

// Limits bound what a job may use. Every field is required.
type Limits struct {
	WallTimeMS  int64 `json:"wall_time_ms"`    // wall-clock deadline, enforced from outside
	CPUMillis   int64 `json:"cpu_millis"`      // CPU quota in thousandths of a core
	MemoryBytes int64 `json:"memory_bytes"`    // memory, with swap equal to memory
	Pids        int64 `json:"pids"`            // processes and threads
	DiskBytes   int64 `json:"disk_bytes"`      // size of each scratch tmpfs (WorkPath, TmpPath; CodeTmpPath at most MemoryBytes/8)
	OutputBytes int64 `json:"output_bytes"`    // total bytes of collected artifacts
	LogBytes    int64 `json:"log_bytes"`       // bytes kept of stdout, and of stderr
	FileCount   int64 `json:"file_count"`      // collected artifacts
	OpenFiles   int64 `json:"open_files"`      // RLIMIT_NOFILE
	FileSize    int64 `json:"file_size_bytes"` // RLIMIT_FSIZE
}

// WallTime returns the wall-clock limit as a duration.
func (l Limits) WallTime() time.Duration { return time.Duration(l.WallTimeMS) * time.Millisecond }

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// limitRanges are the inclusive bounds of each limit, by JSON name.
var limitRanges = []struct {
	name     string
	get      func(Limits) int64
	min, max int64
}{
	{"wall_time_ms", func(l Limits) int64 { return l.WallTimeMS }, 100, 24 * 3600 * 1000},
	{"cpu_millis", func(l Limits) int64 { return l.CPUMillis }, 10, 256 * 1000},
	{"memory_bytes", func(l Limits) int64 { return l.MemoryBytes }, 8 * mib, 256 * gib},
	{"pids", func(l Limits) int64 { return l.Pids }, 8, 65536},
	{"disk_bytes", func(l Limits) int64 { return l.DiskBytes }, 64 * kib, 256 * gib},
	{"output_bytes", func(l Limits) int64 { return l.OutputBytes }, 0, 64 * gib},
	{"log_bytes", func(l Limits) int64 { return l.LogBytes }, 0, 1 * gib},
	{"file_count", func(l Limits) int64 { return l.FileCount }, 0, MaxFileCount},
	{"open_files", func(l Limits) int64 { return l.OpenFiles }, 16, 1 << 20},
	{"file_size_bytes", func(l Limits) int64 { return l.FileSize }, 1 * kib, 256 * gib},
}

// limitWhy says why a limit's bound is what it is, where that is not plain.
var limitWhy = map[string]string{
	"file_count": fmt.Sprintf("a signed result lists every artifact and is at most %d bytes (sandbox.MaxResultBytes)", MaxResultBytes),
}

// DefaultLimits are conservative limits for a test run.
func DefaultLimits() Limits {
	return Limits{
		WallTimeMS:  10 * 60 * 1000,
		CPUMillis:   1000,
		MemoryBytes: 1 * gib,
		Pids:        256,
		DiskBytes:   512 * mib,
		OutputBytes: 64 * mib,
		LogBytes:    1 * mib,
		FileCount:   10_000,
		OpenFiles:   1024,
		FileSize:    256 * mib,
	}
}

// Validate checks every limit against its range; the error names the field.
func (l Limits) Validate(prefix string) error {
	for _, r := range limitRanges {
		v := r.get(l)
		if v < r.min || v > r.max {
			if why := limitWhy[r.name]; why != "" {
				return fieldErr(prefix+"."+r.name, "%d is out of range [%d, %d]: %s", v, r.min, r.max, why)
			}
			return fieldErr(prefix+"."+r.name, "%d is out of range [%d, %d]", v, r.min, r.max)
		}
	}
	return nil
}

// The grammars below bound their length apart: a counted repetition
// ({0,127}) compiles into that many copies of its class, which every
// process (a one-shot sandboxd exec among them) paid at its start.
var (
	jobIDRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`) // at most 128 bytes
	inputNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)         // at most 64
	envKeyRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)     // at most 128
)

func validJobID(s string) bool     { return len(s) <= 128 && jobIDRE.MatchString(s) }
func validInputName(s string) bool { return len(s) <= 64 && inputNameRE.MatchString(s) }
func validEnvKey(s string) bool    { return len(s) <= 128 && envKeyRE.MatchString(s) }

const (
	maxArgs     = 4096
	maxArgBytes = 128 * 1024
	maxEnvVars  = 256
	// maxEnvBytes bounds the environment as exec passes it (NAME=value
	// and a NUL each): with argv it must fit what the kernel takes at
	// exec (a quarter of the stack limit: 2 MiB under the usual 8 MiB),
	// or the job's command could never start.
	maxEnvBytes = 1 << 20
	maxInputs   = 32
	maxOutputs  = 16
	maxPathLen  = 1024
)

// Validate checks a job's fields (not its digest; see Seal and VerifyDigest).
// The error is a *FieldError naming the first field that is wrong.
func (j *Job) Validate() error {
	if j.Schema != JobSchema {
		return fieldErr("job.schema", "unknown schema %q (want %q)", j.Schema, JobSchema)
	}
	if !validJobID(j.ID) {
		return fieldErr("job.id", "%q is not 1-128 characters of [A-Za-z0-9._-] starting with a letter or digit", j.ID)
	}
	if j.Digest != "" && !ValidDigest(j.Digest) {
		return fieldErr("job.digest", "malformed digest %q", j.Digest)
	}
	if !ValidDigest(j.Image) {
		return fieldErr("job.image", "%q is not a local image ID (sha256:<64 hex>); tags and names are refused", j.Image)
	}
	if j.Bundle != "" && !ValidDigest(j.Bundle) {
		return fieldErr("job.bundle", "malformed digest %q", j.Bundle)
	}
	if err := j.validateInputs(); err != nil {
		return err
	}
	if len(j.Argv) == 0 || j.Argv[0] == "" {
		return fieldErr("job.argv", "empty command")
	}
	if len(j.Argv) > maxArgs {
		return fieldErr("job.argv", "%d arguments (at most %d)", len(j.Argv), maxArgs)
	}
	total := 0
	for i, a := range j.Argv {
		total += len(a)
		if strings.IndexByte(a, 0) >= 0 || !utf8.ValidString(a) {
			return fieldErr(fmt.Sprintf("job.argv[%d]", i), "contains NUL or invalid UTF-8")
		}
	}
	if total > maxArgBytes {
		return fieldErr("job.argv", "%d bytes (at most %d)", total, maxArgBytes)
	}
	if len(j.Env) > maxEnvVars {
		return fieldErr("job.env", "%d variables (at most %d)", len(j.Env), maxEnvVars)
	}
	envBytes := 0
	for k, v := range j.Env {
		envBytes += len(k) + len(v) + 2
	}
	if envBytes > maxEnvBytes {
		return fieldErr("job.env", "%d bytes (at most %d)", envBytes, maxEnvBytes)
	}
	for k, v := range j.Env {
		if !validEnvKey(k) {
			return fieldErr("job.env", "bad variable name %q", k)
		}
		if k == "HOSTNAME" {
			return fieldErr("job.env."+k, "is set by the broker")
		}
		if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) || len(v) > 32*1024 {
			return fieldErr("job.env."+k, "value has NUL, invalid UTF-8 or more than 32 KiB")
		}
	}
	if err := checkAbs("job.workdir", j.WorkDir); err != nil {
		return err
	}
	if !under(j.WorkDir, WorkPath) && !under(j.WorkDir, TmpPath) && !under(j.WorkDir, BundlePath) && !under(j.WorkDir, InputsPath) {
		return fieldErr("job.workdir", "%q is not under %s, %s, %s or %s", j.WorkDir, WorkPath, TmpPath, BundlePath, InputsPath)
	}
	if len(j.Outputs) > maxOutputs {
		return fieldErr("job.outputs", "%d outputs (at most %d)", len(j.Outputs), maxOutputs)
	}
	seenOut := map[string]bool{}
	for i, o := range j.Outputs {
		f := fmt.Sprintf("job.outputs[%d]", i)
		if err := checkAbs(f, o); err != nil {
			return err
		}
		if (!under(o, WorkPath) && !under(o, TmpPath)) || o == WorkPath || o == TmpPath {
			return fieldErr(f, "%q must be a directory below %s or %s", o, WorkPath, TmpPath)
		}
		if strings.ContainsFunc(o, isControl) {
			// It would start every artifact path below it, and a signed
			// result lists none with a control character (ResultBound).
			return fieldErr(f, "%q contains a control character", o)
		}
		if seenOut[o] {
			return fieldErr(f, "duplicate output %q", o)
		}
		seenOut[o] = true
		// A file below two outputs would be collected twice, which the
		// broker refuses as a broken stream: the candidate could turn any
		// job into an error by writing one file there.
		for _, other := range j.Outputs[:i] {
			if under(o, other) || under(other, o) {
				return fieldErr(f, "output %q is nested with output %q", o, other)
			}
		}
	}
	if err := j.Limits.Validate("job.limits"); err != nil {
		return err
	}
	if j.Network != NetworkNone {
		return fieldErr("job.network", "%q is not allowed (only %q)", j.Network, NetworkNone)
	}
	if j.Runtime != RuntimeRunc && j.Runtime != RuntimeRunsc {
		return fieldErr("job.runtime", "%q is not %q or %q", j.Runtime, RuntimeRunc, RuntimeRunsc)
	}
	return nil
}

func (j *Job) validateInputs() error {
	if len(j.Inputs) > maxInputs {
		return fieldErr("job.inputs", "%d inputs (at most %d)", len(j.Inputs), maxInputs)
	}
	names := map[string]bool{}
	paths := map[string]bool{}
	for i, in := range j.Inputs {
		f := fmt.Sprintf("job.inputs[%d]", i)
		if !validInputName(in.Name) {
			return fieldErr(f+".name", "%q is not 1-64 of [a-z0-9-]", in.Name)
		}
		if names[in.Name] {
			return fieldErr(f+".name", "duplicate input name %q", in.Name)
		}
		names[in.Name] = true
		if !ValidDigest(in.Digest) {
			return fieldErr(f+".digest", "malformed digest %q", in.Digest)
		}
		if err := checkAbs(f+".path", in.Path); err != nil {
			return err
		}
		if in.Writable {
			if !under(in.Path, WorkPath) {
				return fieldErr(f+".path", "writable input %q must be at or below %s", in.Path, WorkPath)
			}
		} else if in.Path != BundlePath && (!under(in.Path, InputsPath) || in.Path == InputsPath) {
			return fieldErr(f+".path", "read-only input %q must be %s or below %s", in.Path, BundlePath, InputsPath)
		}
		for p := range paths {
			if under(p, in.Path) || under(in.Path, p) {
				if in.Writable || !strings.HasPrefix(p, WorkPath) {
					return fieldErr(f+".path", "%q overlaps another input at %q", in.Path, p)
				}
			}
		}
		paths[in.Path] = true
	}
	return nil
}

func checkAbs(field, p string) error {
	if p == "" || !path.IsAbs(p) || path.Clean(p) != p || len(p) > maxPathLen {
		return fieldErr(field, "%q is not a clean absolute path", p)
	}
	if strings.ContainsAny(p, "\x00\n") || !utf8.ValidString(p) {
		return fieldErr(field, "path contains NUL, newline or invalid UTF-8")
	}
	return nil
}

// isControl reports C0 (NUL and newline included), DEL and C1 controls.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// under reports whether p is dir or inside it (both clean and absolute).
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// Seal validates the job and sets its Digest.
func (j *Job) Seal() error {
	if err := j.Validate(); err != nil {
		return err
	}
	j.normalize()
	d, err := SealedDigest(j)
	if err != nil {
		return err
	}
	j.Digest = d
	return nil
}

// normalize makes empty collections encode the same way as absent ones.
func (j *Job) normalize() {
	if j.Inputs == nil {
		j.Inputs = []Input{}
	}
	if j.Env == nil {
		j.Env = map[string]string{}
	}
	if j.Outputs == nil {
		j.Outputs = []string{}
	}
}

// VerifyDigest validates the job and checks that Digest matches its content.
func (j *Job) VerifyDigest() error {
	if err := j.Validate(); err != nil {
		return err
	}
	if j.Digest == "" {
		return fieldErr("job.digest", "job is not sealed")
	}
	c := *j
	c.normalize()
	d, err := SealedDigest(&c)
	if err != nil {
		return err
	}
	if d != j.Digest {
		return fieldErr("job.digest", "is %s but the job's content hashes to %s", j.Digest, d)
	}
	return nil
}

// CanonicalJSON returns the job's canonical encoding.
func (j *Job) CanonicalJSON() ([]byte, error) {
	c := *j
	c.normalize()
	return CanonicalJSON(&c)
}

// DecodeJob strictly decodes a sealed job: unknown fields, an unknown schema,
// malformed digests, bad limits and a digest that does not match are errors
// that name the field.
func DecodeJob(data []byte) (Job, error) {
	var j Job
	if err := decodeStrict(data, &j); err != nil {
		return Job{}, fmt.Errorf("job: %w: %w", ErrInvalid, err)
	}
	if err := j.VerifyDigest(); err != nil {
		return Job{}, err
	}
	return j, nil
}
