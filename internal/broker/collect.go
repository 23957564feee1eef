package broker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

type hasher struct{ h hash.Hash }

func newHasher() *hasher                      { return &hasher{h: sha256.New()} }
func (h *hasher) Write(p []byte) (int, error) { return h.h.Write(p) }
func (h *hasher) digest() string              { return "sha256:" + hex.EncodeToString(h.h.Sum(nil)) }

// maxRejected bounds the rejected entries kept in a result.
const maxRejected = 1024

// collector turns the helper's frames into logs, artifacts and a status.
// Every frame is untrusted input: paths, counts and sizes are checked
// against the job, and digests are computed here.
type collector struct {
	r      *run
	stdout *logSink
	stderr *logSink

	cur       *store.Writer
	curHdr    shim.FileHeader
	files     int64
	bytes     int64
	seen      map[string]bool
	artifacts []sandbox.Artifact
	rejected  []sandbox.Rejected
	dropped   int
	limits    []string

	hello bool
	// heard is closed once the stream's first frame was judged, or the
	// stream failed before: hello then says whether the helper said it.
	heard       chan struct{}
	heardDone   bool
	starting    bool   // the helper said the command starts (FrameStarting)
	nonce       string // the stream's nonce, from the container's labels
	summary     *shim.CollectSummary
	status      *shim.Status
	helperError string

	// Artifacts go into the blob store as one batch: each is synced and
	// put in place in the background while the stream goes on, and the
	// blob directory is synced once, when the stream has ended, instead of
	// once per artifact. consume returns only after the batch committed.
	batch *store.Batch

	// step reports collection steps to Hooks.OnCollect; halfway is set
	// once the step at half the output limit was reported.
	step    func(string)
	halfway bool
}

func newCollector(r *run) *collector {
	return &collector{
		r:         r,
		nonce:     r.nonce,
		stdout:    newLogSink(r.b.blobs, r.job.Limits.LogBytes),
		stderr:    newLogSink(r.b.blobs, r.job.Limits.LogBytes),
		seen:      map[string]bool{},
		rejected:  []sandbox.Rejected{},
		artifacts: []sandbox.Artifact{},
		batch:     r.b.blobs.NewBatch(),
		step:      r.hooks.OnCollect,
		heard:     make(chan struct{}),
	}
}

func (c *collector) reached(step string) {
	if c.step != nil {
		c.step(step)
	}
}

// errProtocol marks a frame sequence the helper must never send.
var errProtocol = errors.New("protocol violation")

// consume reads the helper's stream to its end. Every artifact it lists is
// durable in the blob store when it returns nil.
func (c *collector) consume(r io.Reader) error {
	err := c.consumeFrames(r)
	// Committed even when the stream failed: the artifacts listed so far
	// stay in the result, and they must be in the store.
	if cerr := c.batch.Commit(); cerr != nil && err == nil {
		err = fmt.Errorf("store artifacts: %w", cerr)
	}
	return err
}

func (c *collector) consumeFrames(r io.Reader) error {
	err := c.frames(shim.NewFrameReader(shim.NewUnstuffReader(r)))
	c.judged() // no hello by now: none comes
	if err != nil {
		c.abortFile()
		// Drain so the container is not blocked on a full pipe: it exits,
		// and the job ends with this error, not at the hard deadline.
		io.Copy(io.Discard, r)
	}
	return err
}

// judged closes heard, once.
func (c *collector) judged() {
	if !c.heardDone {
		c.heardDone = true
		close(c.heard)
	}
}

func (c *collector) frames(fr *shim.FrameReader) error {
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			if c.cur != nil {
				return fmt.Errorf("stream ended inside %s: %w", c.curHdr.Path, io.ErrUnexpectedEOF)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if c.status != nil || c.helperError != "" {
			return fmt.Errorf("frame %q after the last frame: %w", typ, errProtocol)
		}
		if err := c.frame(typ, p); err != nil {
			return err
		}
	}
}

func (c *collector) frame(typ byte, p []byte) error {
	if !c.hello {
		if typ != shim.FrameHello || c.nonce == "" || string(p) != shim.Hello+c.nonce {
			return fmt.Errorf("stream does not start with the helper's hello: %w", errProtocol)
		}
		c.hello = true
		c.judged()
		return nil
	}
	if c.cur != nil && typ != shim.FrameFileData && typ != shim.FrameFileEnd {
		return fmt.Errorf("frame %q inside file %s: %w", typ, c.curHdr.Path, errProtocol)
	}
	if !c.starting && typ != shim.FrameStarting && typ != shim.FrameError {
		// Before the command starts the helper says nothing but an error.
		return fmt.Errorf("frame %q before the command started: %w", typ, errProtocol)
	}
	switch typ {
	case shim.FrameStarting:
		if c.starting {
			return fmt.Errorf("a second starting frame: %w", errProtocol)
		}
		c.starting = true
	case shim.FrameStdout:
		c.stdout.write(p)
	case shim.FrameStderr:
		c.stderr.write(p)
	case shim.FrameFileBegin:
		return c.beginFile(p)
	case shim.FrameFileData:
		if c.cur == nil {
			return fmt.Errorf("file data outside a file: %w", errProtocol)
		}
		if _, err := c.cur.Write(p); err != nil {
			return fmt.Errorf("artifact %s: %w (%w)", c.curHdr.Path, err, errProtocol)
		}
	case shim.FrameFileEnd:
		return c.endFile()
	case shim.FrameRejected:
		var rj shim.Rejected
		if err := json.Unmarshal(p, &rj); err != nil {
			return fmt.Errorf("rejected frame: %w", err)
		}
		c.reject(sanitize(rj.Path), sanitize(rj.Reason))
	case shim.FrameCollected:
		var s shim.CollectSummary
		if err := json.Unmarshal(p, &s); err != nil {
			return fmt.Errorf("summary frame: %w", err)
		}
		c.summary = &s
		c.reached("collect-summary")
		for _, l := range s.LimitsHit {
			if slices.Contains([]string{"file_count", "output_bytes", "file_size_bytes"}, l) {
				c.limit(l)
			}
		}
	case shim.FrameStatus:
		var s shim.Status
		if err := json.Unmarshal(p, &s); err != nil {
			return fmt.Errorf("status frame: %w", err)
		}
		c.status = &s
		c.reached("collect-status")
	case shim.FrameError:
		c.helperError = sanitize(string(p))
	default:
		return fmt.Errorf("unknown frame type %q: %w", typ, errProtocol)
	}
	return nil
}

func (c *collector) beginFile(p []byte) error {
	var h shim.FileHeader
	if err := json.Unmarshal(p, &h); err != nil {
		return fmt.Errorf("file header: %w", err)
	}
	j := c.r.job
	switch {
	case len(h.Path) > shim.MaxArtifactPath:
		// The helper rejects such a file; listed, it could take the
		// signed result past its bound (sandbox.ResultBound).
		return fmt.Errorf("artifact path of %d bytes (at most %d): %w", len(h.Path), shim.MaxArtifactPath, errProtocol)
	case !utf8.ValidString(h.Path) || strings.ContainsFunc(h.Path, isControl) || path.Clean(h.Path) != h.Path || !path.IsAbs(h.Path):
		return fmt.Errorf("artifact path %q is not clean: %w", h.Path, errProtocol)
	case !slices.ContainsFunc(j.Outputs, func(o string) bool { return strings.HasPrefix(h.Path, o+"/") }):
		return fmt.Errorf("artifact %s is outside the job's outputs: %w", h.Path, errProtocol)
	case c.seen[h.Path]:
		return fmt.Errorf("artifact %s sent twice: %w", h.Path, errProtocol)
	case c.files >= j.Limits.FileCount:
		return fmt.Errorf("artifact %s exceeds file_count %d: %w", h.Path, j.Limits.FileCount, errProtocol)
	case h.Size < 0 || h.Size > j.Limits.OutputBytes-c.bytes:
		return fmt.Errorf("artifact %s of %d bytes exceeds output_bytes: %w", h.Path, h.Size, errProtocol)
	}
	w, err := c.batch.NewWriter(h.Size)
	if err != nil {
		return err
	}
	c.seen[h.Path] = true
	c.cur, c.curHdr = w, h
	if c.files == 0 {
		c.reached("collect-begin")
	}
	return nil
}

func (c *collector) endFile() error {
	if c.cur == nil {
		return fmt.Errorf("file end outside a file: %w", errProtocol)
	}
	w, h := c.cur, c.curHdr
	c.cur = nil
	if w.Size() != h.Size {
		w.Abort()
		return fmt.Errorf("artifact %s: %d bytes sent, header said %d: %w", h.Path, w.Size(), h.Size, errProtocol)
	}
	// The digest is the one computed while the bytes streamed in. A
	// failure to store an earlier artifact surfaces here and fails the
	// stream.
	d, n, err := c.batch.Add(w, "")
	if err != nil {
		return fmt.Errorf("store artifacts: %w", err)
	}
	c.files++
	c.bytes += n
	c.artifacts = append(c.artifacts, sandbox.Artifact{Path: h.Path, Digest: d, Size: n, MediaType: mediaType(h.Path)})
	if !c.halfway && 2*c.bytes >= c.r.job.Limits.OutputBytes {
		c.halfway = true
		c.reached("collect-half")
	}
	c.r.hooks.progress("collecting", c.bytes, c.files)
	return nil
}

func (c *collector) abortFile() {
	if c.cur != nil {
		c.cur.Abort()
		c.cur = nil
	}
}

// abort releases whatever finish did not commit: the open artifact and the
// log writers, on the paths that end a job without deciding it. After
// finish it does nothing (a committed writer ignores Abort).
func (c *collector) abort() {
	c.abortFile()
	for _, l := range []*logSink{c.stdout, c.stderr} {
		if l.w != nil {
			l.w.Abort()
		}
	}
}

func (c *collector) reject(p, reason string) {
	if len(c.rejected) >= maxRejected {
		c.dropped++
		return
	}
	c.rejected = append(c.rejected, sandbox.Rejected{Path: p, Reason: reason})
}

func (c *collector) limit(l string) {
	if !slices.Contains(c.limits, l) {
		c.limits = append(c.limits, l)
	}
}

// incomplete says why the stream cannot be trusted to be whole, or "".
func (c *collector) incomplete() string {
	switch {
	case !c.hello:
		return "the helper's hello frame is missing"
	case c.status == nil:
		return "the helper's status frame is missing"
	case c.status.Leftover:
		return ""
	case c.summary == nil:
		return "the collection summary is missing"
	case c.summary.Files != c.files || c.summary.Bytes != c.bytes:
		return fmt.Sprintf("received %d files / %d bytes, the helper sent %d / %d", c.files, c.bytes, c.summary.Files, c.summary.Bytes)
	}
	return ""
}

// finish writes what was collected into the result.
func (c *collector) finish(res *sandbox.Result) {
	c.abortFile()
	res.Stdout = c.stdout.finish()
	res.Stderr = c.stderr.finish()
	slices.SortFunc(c.artifacts, func(a, b sandbox.Artifact) int { return strings.Compare(a.Path, b.Path) })
	res.Artifacts = c.artifacts
	if c.dropped > 0 {
		c.rejected = append(c.rejected, sandbox.Rejected{Reason: fmt.Sprintf("%d more rejected entries not listed", c.dropped)})
	}
	res.Rejected = c.rejected
	for _, l := range c.limits {
		addLimit(res, l)
	}
}

// logSink keeps the first max bytes of a stream in the blob store.
type logSink struct {
	s     *store.Store
	w     *store.Writer
	max   int64
	total int64
	err   error
}

func newLogSink(s *store.Store, max int64) *logSink { return &logSink{s: s, max: max} }

func (l *logSink) write(p []byte) {
	l.total += int64(len(p))
	if l.err != nil {
		return
	}
	if l.w == nil {
		l.w, l.err = l.s.NewWriter(l.max)
		if l.err != nil {
			return
		}
	}
	if room := l.max - l.w.Size(); room > 0 {
		_, l.err = l.w.Write(p[:min(room, int64(len(p)))])
	}
}

func (l *logSink) finish() sandbox.Log {
	if l.w == nil {
		if l.err == nil {
			l.w, l.err = l.s.NewWriter(0)
		}
		if l.err != nil {
			return sandbox.Log{Total: l.total, Truncated: l.total > 0}
		}
	}
	d, n, err := l.w.Commit("")
	if err != nil {
		return sandbox.Log{Total: l.total, Truncated: l.total > 0}
	}
	return sandbox.Log{Digest: d, Bytes: n, Total: l.total, Truncated: l.total > n}
}

func mediaType(p string) string {
	switch strings.ToLower(path.Ext(p)) {
	case ".json":
		return "application/json"
	case ".jsonl", ".ndjson":
		return "application/x-ndjson"
	case ".xml":
		return "application/xml"
	case ".txt", ".log", ".tap":
		return "text/plain"
	}
	return "application/octet-stream"
}

// sanitize bounds text that came from inside the sandbox (a rejected
// entry's path and reason, the helper's error) to 1024 bytes and an
// ellipsis: see clip.
func sanitize(s string) string { return clip(s, 1024) }

// clip makes text fit a result: valid UTF-8 with no control character but
// tab and newline (JSON escapes the others to six bytes each; what is left
// takes at most twice its length), cut to at most max bytes on a character
// boundary and marked by an ellipsis where it was cut.
func clip(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' && r != '\n' {
			return '\uFFFD'
		}
		return r
	}, s)
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// isControl reports the characters the helper never sends in a path: C0
// (NUL and newline included), DEL and C1.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// fitResult keeps the signed result of res within max bytes
// (sandbox.MaxResultBytes): it drops the artifacts that would take it
// over, last by path first, and says so as the helper does when it stops
// at file_count: a rejected entry with their number, file_count among the
// limits hit, and a status of limit_exceeded where the command's exit
// decided it. A job admitted within its limits never gets here
// (sandbox.ResultBound); this is the broker's own guard, on the result as
// it is about to be signed. It returns how many artifacts it dropped, and
// an error if even none would be small enough.
func fitResult(res *sandbox.Result, max int64) (int, error) {
	size, err := sandbox.ResultSize(*res)
	if err != nil {
		return 0, fmt.Errorf("size of the result: %w", err)
	}
	if size <= max {
		return 0, nil
	}
	note := func(n int) string {
		return fmt.Sprintf("%d regular files not listed: file_count limit reached (the signed result would be over %d bytes)", n, max)
	}
	arts := res.Artifacts
	// Everything but the artifacts as it will be signed; the note counts
	// as many files as it can name, so it only gets shorter.
	res.Rejected = append(res.Rejected, sandbox.Rejected{Reason: note(len(arts))})
	addLimit(res, "file_count")
	sort.Strings(res.LimitsHit)
	switch res.Status {
	case sandbox.StatusSucceeded, sandbox.StatusFailed, sandbox.StatusLimitExceeded:
		l := decidingLimit(res.LimitsHit)
		res.Status, res.Limit, res.Cause = sandbox.StatusLimitExceeded, l, "limit reached: "+l
	}
	// The longest prefix that fits.
	keep := sort.Search(len(arts)+1, func(k int) bool {
		trial := *res
		trial.Artifacts = arts[:k]
		n, err := sandbox.ResultSize(trial)
		return err != nil || n > max
	}) - 1
	if keep < 0 {
		res.Artifacts = []sandbox.Artifact{}
		return len(arts), fmt.Errorf("the result is over %d bytes without its artifacts", max)
	}
	res.Artifacts = arts[:keep]
	res.Rejected[len(res.Rejected)-1].Reason = note(len(arts) - keep)
	return len(arts) - keep, nil
}
