package sandbox

import (
	"fmt"
	"time"
)

// ResultSchema is the only result schema version this release writes.
const ResultSchema = "sandboxd.result/v1"

// Status is how a job ended.
type Status string

const (
	StatusSucceeded     Status = "succeeded"      // exited 0, no limit hit
	StatusFailed        Status = "failed"         // exited non-zero (ExitCode kept)
	StatusTimedOut      Status = "timed_out"      // wall-clock deadline reached
	StatusOOMKilled     Status = "oom_killed"     // the memory limit killed a process
	StatusLimitExceeded Status = "limit_exceeded" // another limit was hit (Result.Limit)
	StatusCancelled     Status = "cancelled"      // the caller cancelled it
	StatusError         Status = "error"          // infrastructure failure (Result.Cause)
	StatusUncertain     Status = "uncertain"      // the broker cannot prove what happened
)

// Valid reports whether s is one of the defined statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusTimedOut, StatusOOMKilled,
		StatusLimitExceeded, StatusCancelled, StatusError, StatusUncertain:
		return true
	}
	return false
}

// Result reports what happened to one job, as observed by the broker from
// outside the sandbox.
type Result struct {
	Schema    string `json:"schema"`
	JobID     string `json:"job_id"`
	JobDigest string `json:"job_digest"`
	// ReceiptDigest binds the result to the receipt of the same job, once
	// receipts are signed.
	ReceiptDigest string `json:"receipt_digest,omitempty"`
	Status        Status `json:"status"`
	// Limit names the limit hit first when Status is limit_exceeded, using
	// the JSON names of Limits.
	Limit string `json:"limit,omitempty"`
	// LimitsHit lists every limit hit, including ones that did not decide
	// the status (e.g. output truncation after a non-zero exit).
	LimitsHit []string `json:"limits_hit"`
	// Cause explains an error, cancelled or uncertain status.
	Cause     string    `json:"cause,omitempty"`
	ExitCode  int       `json:"exit_code"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	Usage     Usage     `json:"usage"`
	// Security holds the settings read back from the inspected container,
	// not the ones asked for.
	Security Security     `json:"security"`
	Runtime  RuntimeFacts `json:"runtime"`
	Stdout   Log          `json:"stdout"`
	Stderr   Log          `json:"stderr"`
	// Artifacts are the collected regular files, sorted by path.
	Artifacts []Artifact `json:"artifacts"`
	// Rejected lists output entries that were not collected and why.
	Rejected []Rejected `json:"rejected"`
}

// Usage is what the job consumed.
type Usage struct {
	WallTimeMS int64 `json:"wall_time_ms"`
	// WorkBytesUsed and TmpBytesUsed are the scratch space in use when the
	// command ended.
	WorkBytesUsed int64 `json:"work_bytes_used"`
	TmpBytesUsed  int64 `json:"tmp_bytes_used"`
}

// Log describes one captured stream. The bytes themselves are evidence for
// people; no verdict is ever read from them.
type Log struct {
	Digest    string `json:"digest"`    // of the bytes kept
	Bytes     int64  `json:"bytes"`     // bytes kept
	Total     int64  `json:"total"`     // bytes the job wrote
	Truncated bool   `json:"truncated"` // Total > Bytes
}

// Artifact is one collected regular file.
type Artifact struct {
	// Path is the file's path in the sandbox, e.g. "/work/out/report.json".
	Path      string `json:"path"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
}

// Rejected is an output entry that was not collected.
type Rejected struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Security is the sandbox's security configuration as inspected on the
// created container before it started.
type Security struct {
	User         string `json:"user"`
	CandidateUID int    `json:"candidate_uid"`
	// CodeUID is the uid of programs run through the helper's exec
	// service (0: no service).
	CodeUID        int      `json:"code_uid,omitempty"`
	Privileged     bool     `json:"privileged"`
	CapAdd         []string `json:"cap_add"`
	CapDrop        []string `json:"cap_drop"`
	NoNewPrivs     bool     `json:"no_new_privileges"`
	SeccompDigest  string   `json:"seccomp_digest"`
	ReadonlyRootfs bool     `json:"readonly_rootfs"`
	NetworkMode    string   `json:"network_mode"`
	DNS            []string `json:"dns"`
	IpcMode        string   `json:"ipc_mode"`
	CgroupnsMode   string   `json:"cgroupns_mode"`
	PidMode        string   `json:"pid_mode"`
	UTSMode        string   `json:"uts_mode"`
	UsernsMode     string   `json:"userns_mode"`
	Memory         int64    `json:"memory"`
	MemorySwap     int64    `json:"memory_swap"`
	NanoCPUs       int64    `json:"nano_cpus"`
	PidsLimit      int64    `json:"pids_limit"`
	OomScoreAdj    int      `json:"oom_score_adj"`
	Ulimits        []Ulimit `json:"ulimits"`
	Init           bool     `json:"init"`
	Tmpfs          []string `json:"tmpfs"` // "path:options"
	Mounts         []Mount  `json:"mounts"`
	LogDriver      string   `json:"log_driver"`
	LogOptions     []string `json:"log_options"`
	MaskedPaths    []string `json:"masked_paths"`
	ReadonlyPaths  []string `json:"readonly_paths"`
	Runtime        string   `json:"runtime"`
	Relaxations    []string `json:"relaxations"`
}

// Ulimit is one resource limit as set on the container.
type Ulimit struct {
	Name string `json:"name"`
	Soft int64  `json:"soft"`
	Hard int64  `json:"hard"`
}

// Mount is one volume mounted into the container.
type Mount struct {
	Type     string `json:"type"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only"`
}

// RuntimeFacts describe the broker and engine that ran the job.
type RuntimeFacts struct {
	BrokerVersion string `json:"broker_version"`
	// Engine names the engine that ran the job: "docker" or "containerd"
	// (absent from results made before there was a choice: docker).
	Engine        string `json:"engine,omitempty"`
	EngineVersion string `json:"engine_version"`
	EngineAPI     string `json:"engine_api"`
	Runtime       string `json:"runtime"`
	SeccompDigest string `json:"seccomp_digest"`
	ShimDigest    string `json:"shim_digest"`
}

// Validate checks the fields a consumer relies on.
func (r *Result) Validate() error {
	if r.Schema != ResultSchema {
		return fieldErr("result.schema", "unknown schema %q (want %q)", r.Schema, ResultSchema)
	}
	if !validJobID(r.JobID) {
		return fieldErr("result.job_id", "malformed job id %q", r.JobID)
	}
	if !ValidDigest(r.JobDigest) {
		return fieldErr("result.job_digest", "malformed digest %q", r.JobDigest)
	}
	if r.ReceiptDigest != "" && !ValidDigest(r.ReceiptDigest) {
		return fieldErr("result.receipt_digest", "malformed digest %q", r.ReceiptDigest)
	}
	if !r.Status.Valid() {
		return fieldErr("result.status", "unknown status %q", r.Status)
	}
	if r.Status == StatusLimitExceeded && r.Limit == "" {
		return fieldErr("result.limit", "limit_exceeded without the limit's name")
	}
	for i, a := range r.Artifacts {
		if !ValidDigest(a.Digest) {
			return fieldErr(fmt.Sprintf("result.artifacts[%d].digest", i), "malformed digest %q", a.Digest)
		}
		if a.Size < 0 {
			return fieldErr(fmt.Sprintf("result.artifacts[%d].size", i), "negative size")
		}
	}
	for _, l := range []struct {
		name string
		log  Log
	}{{"stdout", r.Stdout}, {"stderr", r.Stderr}} {
		if l.log.Digest != "" && !ValidDigest(l.log.Digest) {
			return fieldErr("result."+l.name+".digest", "malformed digest %q", l.log.Digest)
		}
	}
	return nil
}

// DecodeResult strictly decodes a result.
func DecodeResult(data []byte) (Result, error) {
	var r Result
	if err := decodeStrict(data, &r); err != nil {
		return Result{}, fmt.Errorf("result: %w: %w", ErrInvalid, err)
	}
	if err := r.Validate(); err != nil {
		return Result{}, err
	}
	return r, nil
}

// Artifact returns the artifact collected at path, if any.
func (r *Result) Artifact(path string) (Artifact, bool) {
	for _, a := range r.Artifacts {
		if a.Path == path {
			return a, true
		}
	}
	return Artifact{}, false
}
