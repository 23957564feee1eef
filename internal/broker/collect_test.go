package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// stream builds a helper stream frame by frame.
type stream struct{ bytes.Buffer }

func (s *stream) frame(typ byte, p []byte) *stream {
	// Stuffed, as the helper writes it.
	if err := shim.WriteFrame(shim.NewStuffWriter(&s.Buffer), typ, p); err != nil {
		panic(err)
	}
	return s
}

func (s *stream) json(typ byte, v any) *stream {
	b, _ := json.Marshal(v)
	return s.frame(typ, b)
}

// hello is the stream's hello and the command's start.
func (s *stream) hello() *stream { return s.greet().frame(shim.FrameStarting, nil) }

// greet is the hello alone: a helper whose command has not started.
func (s *stream) greet() *stream { return s.frame(shim.FrameHello, []byte(shim.Hello+testNonce)) }

const testNonce = "0123456789abcdef"

func (s *stream) file(path, content string) *stream {
	s.json(shim.FrameFileBegin, shim.FileHeader{Path: path, Size: int64(len(content))})
	if content != "" {
		s.frame(shim.FrameFileData, []byte(content))
	}
	return s.frame(shim.FrameFileEnd, nil)
}

func (s *stream) end(files, bytes int64) *stream {
	s.json(shim.FrameCollected, shim.CollectSummary{Files: files, Bytes: bytes, LimitsHit: []string{}})
	return s.json(shim.FrameStatus, shim.Status{LimitsHit: []string{}})
}

func testRun(t *testing.T) *run {
	t.Helper()
	blobs, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := sandbox.DefaultLimits()
	l.FileCount, l.OutputBytes, l.LogBytes = 2, 10, 4
	j := &sandbox.Job{ID: "j", Outputs: []string{"/work/out"}, Limits: l}
	return &run{b: &Broker{blobs: blobs}, job: j, nonce: testNonce}
}

func TestCollectorAcceptsAWholeStream(t *testing.T) {
	r := testRun(t)
	c := newCollector(r)
	s := new(stream).hello().frame(shim.FrameStdout, []byte("hello world")).
		file("/work/out/a", "abc").file("/work/out/d/b", "").
		json(shim.FrameRejected, shim.Rejected{Path: "/work/out/link", Reason: "symbolic link"}).end(2, 3)
	if err := c.consume(s); err != nil {
		t.Fatal(err)
	}
	if why := c.incomplete(); why != "" {
		t.Fatalf("incomplete: %s", why)
	}
	var res sandbox.Result
	c.finish(&res)
	if len(res.Artifacts) != 2 || res.Artifacts[0].Digest != sandbox.DigestBytes([]byte("abc")) || res.Artifacts[1].Size != 0 {
		t.Fatalf("artifacts %+v", res.Artifacts)
	}
	if res.Stdout.Bytes != 4 || res.Stdout.Total != 11 || !res.Stdout.Truncated {
		t.Fatalf("stdout %+v, want 4 of 11 bytes kept", res.Stdout)
	}
	if len(res.Rejected) != 1 || res.Rejected[0].Path != "/work/out/link" {
		t.Fatalf("rejected %+v", res.Rejected)
	}
}

func TestCollectorRefusesProtocolViolations(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *stream
		want string
	}{
		{"no hello", new(stream).file("/work/out/a", "x"), "hello"},
		{"wrong hello", new(stream).frame(shim.FrameHello, []byte("other/9")), "hello"},
		{"hello without the nonce", new(stream).frame(shim.FrameHello, []byte(shim.Hello)), "hello"},
		{"hello with another nonce", new(stream).frame(shim.FrameHello, []byte(shim.Hello+"fedcba9876543210")), "hello"},
		{"outside outputs", new(stream).hello().file("/etc/shadow", "x"), "outside the job's outputs"},
		{"output dir itself", new(stream).hello().file("/work/out", "x"), "outside the job's outputs"},
		{"sibling prefix", new(stream).hello().file("/work/outside/a", "x"), "outside the job's outputs"},
		{"dot dot", new(stream).hello().file("/work/out/../../etc/passwd", "x"), "not clean"},
		{"relative", new(stream).hello().file("work/out/a", "x"), "not clean"},
		{"newline", new(stream).hello().file("/work/out/a\nb", "x"), "not clean"},
		{"control character", new(stream).hello().file("/work/out/a\x1bb", "x"), "not clean"},
		{"C1 control", new(stream).hello().file("/work/out/a\u0085b", "x"), "not clean"},
		{"path over the artifact bound", new(stream).hello().file(longPath(shim.MaxArtifactPath+1), "x"), "at most 1024"},
		{"duplicate", new(stream).hello().file("/work/out/a", "x").file("/work/out/a", "y"), "sent twice"},
		{"over file count", new(stream).hello().file("/work/out/a", "").file("/work/out/b", "").file("/work/out/c", ""), "file_count"},
		{"over output bytes", new(stream).hello().file("/work/out/a", "0123456789x"), "output_bytes"},
		{"more data than header", new(stream).hello().json(shim.FrameFileBegin, shim.FileHeader{Path: "/work/out/a", Size: 1}).frame(shim.FrameFileData, []byte("xy")), "artifact /work/out/a"},
		{"less data than header", new(stream).hello().json(shim.FrameFileBegin, shim.FileHeader{Path: "/work/out/a", Size: 5}).frame(shim.FrameFileData, []byte("xy")).frame(shim.FrameFileEnd, nil), "header said 5"},
		{"data outside a file", new(stream).hello().frame(shim.FrameFileData, []byte("x")), "outside a file"},
		{"stdout inside a file", new(stream).hello().json(shim.FrameFileBegin, shim.FileHeader{Path: "/work/out/a", Size: 1}).frame(shim.FrameStdout, []byte("x")), "inside file"},
		{"frame after status", new(stream).hello().end(0, 0).frame(shim.FrameStdout, []byte("x")), "after the last frame"},
		{"unknown frame", new(stream).hello().frame('Z', nil), "unknown frame"},
		{"stdout before the start", new(stream).greet().frame(shim.FrameStdout, []byte("x")), "before the command started"},
		{"status before the start", new(stream).greet().json(shim.FrameStatus, shim.Status{}), "before the command started"},
		{"a second start", new(stream).hello().frame(shim.FrameStarting, nil), "second starting frame"},
		{"ends inside a file", new(stream).hello().json(shim.FrameFileBegin, shim.FileHeader{Path: "/work/out/a", Size: 1}), "inside /work/out/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(testRun(t))
			err := c.consume(tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCollectorIncompleteStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *stream
		want string
	}{
		{"no status", new(stream).hello().json(shim.FrameCollected, shim.CollectSummary{}), "status frame is missing"},
		{"no summary", new(stream).hello().json(shim.FrameStatus, shim.Status{}), "summary is missing"},
		{"summary disagrees", new(stream).hello().file("/work/out/a", "x").end(2, 1), "received 1 files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(testRun(t))
			if err := c.consume(tc.s); err != nil {
				t.Fatal(err)
			}
			if got := c.incomplete(); !strings.Contains(got, tc.want) {
				t.Fatalf("incomplete() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	status := func(mod func(*shim.Status)) *stream {
		st := shim.Status{LimitsHit: []string{}, ScratchUsed: map[string]int64{}}
		mod(&st)
		s := new(stream).hello()
		s.json(shim.FrameCollected, shim.CollectSummary{LimitsHit: []string{}})
		return s.json(shim.FrameStatus, st)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name       string
		ctx        context.Context
		s          *stream
		oom, hard  bool
		stdinErr   error
		wantStatus sandbox.Status
		wantLimit  string
	}{
		{"exit 0", context.Background(), status(func(s *shim.Status) {}), false, false, nil, sandbox.StatusSucceeded, ""},
		{"exit 3", context.Background(), status(func(s *shim.Status) { s.ExitCode = 3 }), false, false, nil, sandbox.StatusFailed, ""},
		{"oom wins over exit 0", context.Background(), status(func(s *shim.Status) {}), true, false, nil, sandbox.StatusOOMKilled, ""},
		{"the engine's oom after the code uid ran is not the job's", context.Background(), status(func(s *shim.Status) { s.CodeUIDRan = true; s.ExitCode = 3 }), true, false, nil, sandbox.StatusFailed, ""},
		{"the engine's oom with no status is the job's", context.Background(), new(stream).hello(), true, false, nil, sandbox.StatusOOMKilled, ""},
		{"oom counted by the helper (the engine's word came late)", context.Background(), status(func(s *shim.Status) { s.OOMKilled = true; s.ExitCode = 137; s.Signal = "SIGKILL" }), false, false, nil, sandbox.StatusOOMKilled, ""},
		{"hard deadline wins over oom", context.Background(), status(func(s *shim.Status) {}), true, true, nil, sandbox.StatusTimedOut, ""},
		{"helper deadline", context.Background(), status(func(s *shim.Status) { s.TimedOut = true; s.ExitCode = 137 }), false, false, nil, sandbox.StatusTimedOut, ""},
		{"disk full", context.Background(), status(func(s *shim.Status) { s.LimitsHit = []string{"disk_bytes"}; s.ExitCode = 1 }), false, false, nil, sandbox.StatusLimitExceeded, "disk_bytes"},
		{"file size", context.Background(), status(func(s *shim.Status) { s.LimitsHit = []string{"file_size_bytes"} }), false, false, nil, sandbox.StatusLimitExceeded, "file_size_bytes"},
		{"log truncation is not a status", context.Background(), status(func(s *shim.Status) { s.StdoutTotal = 100 }), false, false, nil, sandbox.StatusSucceeded, ""},
		{"leftover processes", context.Background(), status(func(s *shim.Status) { s.Leftover = true; s.Error = "survived" }), false, false, nil, sandbox.StatusError, ""},
		{"staging failed", context.Background(), status(func(s *shim.Status) {}), false, false, errors.New("blob changed"), sandbox.StatusError, ""},
		{"no status", context.Background(), new(stream).hello(), false, false, nil, sandbox.StatusError, ""},
		{"cancelled", cancelled, status(func(s *shim.Status) {}), false, false, nil, sandbox.StatusCancelled, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRun(t)
			c := newCollector(r)
			streamErr := c.consume(tc.s)
			r.decide(tc.ctx, c, tc.oom, tc.hard, tc.stdinErr, streamErr, "")
			if r.res.Status != tc.wantStatus || r.res.Limit != tc.wantLimit {
				t.Fatalf("got %s/%q (%s), want %s/%q", r.res.Status, r.res.Limit, r.res.Cause, tc.wantStatus, tc.wantLimit)
			}
		})
	}
}

// A stream that breaks below the frame layer (a frame longer than the
// protocol allows) fails, and the rest of it is still read: the helper is
// never left blocked on a full pipe until the hard deadline, which would
// report the broken stream as a timeout.
func TestCollectorDrainsABrokenStream(t *testing.T) {
	var s stream
	s.hello()
	s.Write([]byte{shim.FrameStdout, 0xff, 0xff, 0xff, 0xff})
	rest := bytes.Repeat([]byte("x"), 1<<20)
	s.Write(rest)
	r := strings.NewReader(s.String())
	err := newCollector(testRun(t)).consume(r)
	if !errors.Is(err, shim.ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes of the stream left unread", r.Len())
	}
}

// longPath is a clean artifact path of n bytes below /work/out.
func longPath(n int) string {
	p := "/work/out/"
	for len(p)+255 < n {
		p += strings.Repeat("d", 254) + "/"
	}
	return p + strings.Repeat("f", n-len(p))
}

// The path bound the helper keeps and the broker enforces is the one the
// signed result's bound is computed with.
func TestArtifactPathBoundIsTheResults(t *testing.T) {
	if shim.MaxArtifactPath != sandbox.MaxArtifactPathBytes {
		t.Fatalf("shim.MaxArtifactPath = %d, sandbox.MaxArtifactPathBytes = %d", shim.MaxArtifactPath, sandbox.MaxArtifactPathBytes)
	}
	c := newCollector(testRun(t))
	p := longPath(shim.MaxArtifactPath)
	if err := c.consume(new(stream).hello().file(p, "x").end(1, 1)); err != nil {
		t.Fatalf("a path of exactly %d bytes: %v", len(p), err)
	}
}

// Text from inside the sandbox reaches a result valid, without the
// control characters JSON escapes to six bytes, and cut on a character
// boundary.
func TestClip(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"short", "hello", 8, "hello"},
		{"tab and newline kept", "a\tb\nc", 8, "a\tb\nc"},
		{"controls replaced", "a\x1b[2J\x00b", 16, "a\uFFFD[2J\uFFFDb"},
		{"invalid UTF-8 replaced", "a\xffb", 8, "a\uFFFDb"},
		{"cut", "abcdef", 4, "abcd…"},
		{"cut before a character it would split", "abcé", 4, "abc…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clip(tc.in, tc.max); got != tc.want {
				t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
		})
	}
}

// What the sandbox's status frame says reaches the result only within
// bounds: unknown limit names are dropped, the signal and the error are
// clipped.
func TestDecideBoundsTheStatusFrame(t *testing.T) {
	huge := strings.Repeat("\x01", 100<<10) // 600 KB in the frame
	for _, tc := range []struct {
		name  string
		st    shim.Status
		check func(t *testing.T, res sandbox.Result)
	}{
		{"unknown limits", shim.Status{LimitsHit: []string{"pids", huge, "no_such_limit"}}, func(t *testing.T, res sandbox.Result) {
			if strings.Join(res.LimitsHit, ",") != "pids" {
				t.Errorf("got limits hit %.80q, want only pids", res.LimitsHit)
			}
		}},
		{"signal", shim.Status{ExitCode: 137, Signal: huge}, func(t *testing.T, res sandbox.Result) {
			if len(res.Cause) > 100 || strings.ContainsRune(res.Cause, 1) {
				t.Errorf("got a cause of %d bytes (%.40q…), want the signal clipped", len(res.Cause), res.Cause)
			}
		}},
		{"leftover error", shim.Status{Leftover: true, Error: huge}, func(t *testing.T, res sandbox.Result) {
			if len(res.Cause) > maxCauseBytes+3 || strings.ContainsRune(res.Cause, 1) {
				t.Errorf("got a cause of %d bytes, want at most %d", len(res.Cause), maxCauseBytes+3)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRun(t)
			c := newCollector(r)
			tc.st.ScratchUsed = map[string]int64{}
			s := new(stream).hello().json(shim.FrameCollected, shim.CollectSummary{LimitsHit: []string{}}).json(shim.FrameStatus, tc.st)
			r.decide(context.Background(), c, false, false, nil, c.consume(s), "")
			tc.check(t, r.res)
		})
	}
}

// The broker's own guard: a result that would be over its bound when
// signed loses the artifacts that take it over, and says so, instead of
// being signed over the bound; whatever decided the status before is kept
// where it outranks the file count.
func TestResultIsKeptWithinItsBound(t *testing.T) {
	const files = 40
	collected := func(st shim.Status) *stream {
		s := new(stream).hello()
		for i := range files {
			s.file(fmt.Sprintf("/work/out/%03d-%s", i, strings.Repeat(`"`, 1000)), "")
		}
		st.LimitsHit, st.ScratchUsed = append([]string{}, st.LimitsHit...), map[string]int64{}
		s.json(shim.FrameCollected, shim.CollectSummary{Files: files, LimitsHit: []string{}})
		return s.json(shim.FrameStatus, st)
	}
	for _, tc := range []struct {
		name       string
		st         shim.Status
		hard       bool
		max        int64 // 0: what the whole result takes
		wantStatus sandbox.Status
		wantLimit  string
		wantKept   int // -1: some, not all
	}{
		{"within the bound", shim.Status{}, false, 0, sandbox.StatusSucceeded, "", files},
		{"over, exit 0", shim.Status{}, false, 60 << 10, sandbox.StatusLimitExceeded, "file_count", -1},
		{"over, exit 3", shim.Status{ExitCode: 3}, false, 60 << 10, sandbox.StatusLimitExceeded, "file_count", -1},
		{"over, disk full first", shim.Status{LimitsHit: []string{"disk_bytes"}}, false, 60 << 10, sandbox.StatusLimitExceeded, "disk_bytes", -1},
		{"over, timed out", shim.Status{}, true, 60 << 10, sandbox.StatusTimedOut, "", -1},
		{"over even without its artifacts", shim.Status{}, false, 1 << 10, sandbox.StatusError, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRun(t)
			r.job.Limits.FileCount = files
			r.log = slog.New(slog.DiscardHandler)
			r.res = sandbox.Result{Schema: sandbox.ResultSchema, JobID: "j", JobDigest: "sha256:" + strings.Repeat("a", 64),
				LimitsHit: []string{}, Artifacts: []sandbox.Artifact{}, Rejected: []sandbox.Rejected{}}
			c := newCollector(r)
			r.decide(context.Background(), c, false, tc.hard, nil, c.consume(collected(tc.st)), "")
			if len(r.res.Artifacts) != files {
				t.Fatalf("collected %d artifacts (%s: %s), want %d", len(r.res.Artifacts), r.res.Status, r.res.Cause, files)
			}
			whole, err := sandbox.ResultSize(r.res)
			if err != nil {
				t.Fatal(err)
			}
			r.maxResult = tc.max
			if tc.max == 0 {
				r.maxResult = whole
			}
			r.bound()
			res := r.res
			if res.Status != tc.wantStatus || res.Limit != tc.wantLimit {
				t.Errorf("got %s/%q (%s), want %s/%q", res.Status, res.Limit, res.Cause, tc.wantStatus, tc.wantLimit)
			}
			size, err := sandbox.ResultSize(res)
			if err != nil {
				t.Fatal(err)
			}
			if size > r.maxResult && tc.wantStatus != sandbox.StatusError {
				t.Errorf("the result takes %d bytes, over the bound of %d", size, r.maxResult)
			}
			kept := len(res.Artifacts)
			switch {
			case tc.wantKept >= 0 && kept != tc.wantKept, tc.wantKept < 0 && (kept == 0 || kept == files):
				t.Fatalf("kept %d of %d artifacts, want %d (-1: some)", kept, files, tc.wantKept)
			case kept == files:
				return
			}
			if tc.wantStatus == sandbox.StatusError && !strings.Contains(res.Cause, "bound") {
				t.Errorf("got cause %q, want it to say the result is over its bound", res.Cause)
			}
			if tc.wantStatus != sandbox.StatusError {
				// The longest prefix that fits: one more would not.
				if !slices.Contains(res.LimitsHit, "file_count") {
					t.Errorf("limits hit %v, want file_count among them", res.LimitsHit)
				}
				note := res.Rejected[len(res.Rejected)-1].Reason
				if want := fmt.Sprintf("%d regular files not listed", files-kept); !strings.HasPrefix(note, want) || !strings.Contains(note, fmt.Sprint(r.maxResult)) {
					t.Errorf("last rejected entry %q, want it to start %q and name the bound", note, want)
				}
				more := res
				more.Artifacts = r.res.Artifacts[:kept:kept]
				more.Artifacts = append(more.Artifacts, sandbox.Artifact{Path: fmt.Sprintf("/work/out/%03d-%s", kept, strings.Repeat(`"`, 1000)), Digest: res.Artifacts[0].Digest, MediaType: "application/octet-stream"})
				if n, _ := sandbox.ResultSize(more); n <= r.maxResult {
					t.Errorf("%d artifacts kept, but %d would fit (%d bytes of %d)", kept, kept+1, n, r.maxResult)
				}
			}
		})
	}
}
