package shim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// FrameConfig is the type of the first (and only) frame on the helper's
// stdin; the input tars follow it, each after WriteInputHeader, then
// GoAhead.
const FrameConfig byte = 'c'

// GoAhead is the byte that follows the last input tar on the helper's
// stdin (when the job has writable inputs): the broker sends it once
// every input it sent passed its check (the digest and the tar rules,
// over the very bytes sent). Without it, the stage fails and nothing of
// the candidate runs.
const GoAhead byte = 'g'

// Frame types on the helper's stdout.
const (
	FrameHello     byte = 'H' // Hello payload: the first frame
	FrameStarting  byte = 'B' // empty: the command starts now; nothing of the candidate ran before it
	FrameStdout    byte = 'o' // a chunk of the command's stdout
	FrameStderr    byte = 'e' // a chunk of the command's stderr
	FrameFileBegin byte = 'F' // FileHeader JSON: an artifact follows
	FrameFileData  byte = 'd' // a chunk of the current artifact
	FrameFileEnd   byte = 'f' // the current artifact is complete
	FrameRejected  byte = 'R' // Rejected JSON: an output entry not collected
	FrameCollected byte = 'C' // CollectSummary JSON: collection finished
	FrameStatus    byte = 'S' // Status JSON: the last frame
	FrameError     byte = 'X' // helper failure text; the last frame
)

// Hello starts the payload of the first frame; the rest is the stream's
// nonce. A stream that does not start with exactly that (e.g. a log whose
// beginning was rotated away, or a forged stream a candidate wrote into
// its output hoping a rotation lands on it) is not the helper's. Version 2
// is byte-stuffed (see StuffWriter); version 3 runs nothing on writable
// inputs before the broker's GoAhead, and the broker sends no input before
// it read this hello: a helper of another version is sent none.
const Hello = "sandboxd-shim/3 "

// NonceEnv names the environment variable that gives the helper its
// stream nonce. The container's environment is readable only by root
// processes inside (the candidate gets an explicit environment), and the
// helper passes it to no child.
const NonceEnv = "SANDBOXD_STREAM_NONCE"

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// Config is what the broker tells the helper, as the first stdin frame.
type Config struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env"` // exactly the command's environment, KEY=VALUE
	WorkDir string   `json:"workdir"`
	UID     int      `json:"uid"`
	GID     int      `json:"gid"`
	// CodeUID and CodeGID, when set, are the second identity of the exec
	// service (see execService): programs run through it cannot reach
	// anything of UID's.
	CodeUID int `json:"code_uid,omitempty"`
	CodeGID int `json:"code_gid,omitempty"`
	// CodeTmp is the code uid's own tmpfs: the $TMPDIR of every program
	// the exec service runs ("": the caller's environment as it is).
	CodeTmp string `json:"code_tmp,omitempty"`
	// Inputs are the writable inputs, in the order their tars follow on stdin.
	Inputs []string `json:"inputs"`
	// MakeDirs are created (as the candidate) before the command runs.
	MakeDirs    []string `json:"make_dirs"`
	Outputs     []string `json:"outputs"`
	Scratch     []string `json:"scratch"` // tmpfs mounts whose use is reported
	DeadlineMS  int64    `json:"deadline_ms"`
	LogBytes    int64    `json:"log_bytes"`
	OutputBytes int64    `json:"output_bytes"`
	FileCount   int64    `json:"file_count"`
	// FileSize is RLIMIT_FSIZE: a scratch file that reached it means a
	// write was cut short (SIGXFSZ), even if the process that got the
	// signal was not the command itself.
	FileSize int64 `json:"file_size_bytes"`
	MaxInput int64 `json:"max_input_bytes"`
}

// MaxArtifactPath bounds the path in a FileHeader: the collector rejects a
// file whose path is longer (its Rejected frame names it), and the broker
// refuses a header with a longer one. It is sandbox.MaxArtifactPathBytes
// (this package links nothing outside the standard library).
const MaxArtifactPath = 1024

// FileHeader announces one artifact.
type FileHeader struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Rejected is an output entry the collector did not send.
type Rejected struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// CollectSummary ends the collection.
type CollectSummary struct {
	Files     int64    `json:"files"`
	Bytes     int64    `json:"bytes"`
	LimitsHit []string `json:"limits_hit"`
}

// Status is the helper's last word.
type Status struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"` // set when the command was killed by a signal
	TimedOut bool   `json:"timed_out"`
	// LimitsHit names limits the helper saw hit: disk_bytes,
	// file_size_bytes, log_bytes (stdout/stderr truncation is in the totals).
	LimitsHit   []string         `json:"limits_hit"`
	StdoutTotal int64            `json:"stdout_total"`
	StderrTotal int64            `json:"stderr_total"`
	ScratchUsed map[string]int64 `json:"scratch_used"`
	// Leftover is set when candidate processes survived the kill; nothing
	// was collected then.
	Leftover bool `json:"leftover"`
	// OOMKilled is set when the sandbox's memory cgroup killed a process
	// while the command ran (its oom_kill count rose), the candidate's
	// (not counted once the exec service ran a program of the code uid).
	OOMKilled bool `json:"oom_killed,omitempty"`
	// CodeUIDRan is set when the exec service ran a program of the code
	// uid during the job: a process the memory limit killed may then have
	// been that program (the candidate's code, run by a grader, which
	// judges its end), and the broker does not take the engine's word of
	// a kill for the job's either.
	CodeUIDRan bool   `json:"code_uid_ran,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}

// WriteFrame writes one frame: type, big-endian length, payload.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(payload), MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// ErrFrameTooLarge is returned for a frame longer than MaxFrame.
var ErrFrameTooLarge = errors.New("frame too large")

// FrameReader reads frames, reusing one buffer.
type FrameReader struct {
	r   io.Reader
	buf []byte
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Next returns the next frame. The payload is valid until the next call.
// io.EOF means a clean end between frames.
func (fr *FrameReader) Next() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return 0, nil, fmt.Errorf("truncated frame header: %w", err)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame type %q of %d bytes: %w", hdr[0], n, ErrFrameTooLarge)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		return 0, nil, fmt.Errorf("truncated frame payload: %w", io.ErrUnexpectedEOF)
	}
	return hdr[0], p, nil
}

// WriteInputHeader writes the length that precedes one input tar on the
// helper's stdin.
func WriteInputHeader(w io.Writer, size int64) error {
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(size))
	_, err := w.Write(hdr[:])
	return err
}
