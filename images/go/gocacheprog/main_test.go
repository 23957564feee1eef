package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The test binary is the cache program too: the go command of
// TestTheGoCommandReadsTheCacheInPlace starts it with this variable set.
func TestMain(m *testing.M) {
	if os.Getenv("GOCACHEPROG_TEST_SERVE") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// session drives serve as the go command does, over pipes.
type session struct {
	t    *testing.T
	in   *io.PipeWriter
	out  *bufio.Scanner
	done chan error
	id   int64
}

func start(t *testing.T, ro, rw string) *session {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{t: t, in: inW, out: bufio.NewScanner(outR), done: make(chan error, 1)}
	s.out.Buffer(nil, 1<<20)
	go func() {
		err := serve(ro, rw, inR, outW)
		outW.CloseWithError(io.EOF)
		s.done <- err
	}()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	var hello response
	s.read(&hello)
	if hello.ID != 0 || strings.Join(hello.KnownCommands, ",") != "get,put,close" {
		t.Fatalf("first message %+v, want ID 0 and get,put,close", hello)
	}
	return s
}

func (s *session) read(v any) {
	s.t.Helper()
	if !s.out.Scan() {
		s.t.Fatalf("no response: %v", s.out.Err())
	}
	if err := json.Unmarshal(s.out.Bytes(), v); err != nil {
		s.t.Fatalf("response %q: %v", s.out.Text(), err)
	}
}

func (s *session) send(r request, body []byte) response {
	s.t.Helper()
	var quoted []byte
	if body != nil {
		quoted, _ = json.Marshal(body)
	}
	return s.sendQuoted(r, quoted)
}

// sendQuoted writes a request as the go command does: the request and a
// blank line, then (if any) the body's base64 as a JSON string on a line
// of its own, here given as it is to be written.
func (s *session) sendQuoted(r request, quoted []byte) response {
	s.t.Helper()
	s.id++
	r.ID = s.id
	line, _ := json.Marshal(r)
	line = append(line, '\n', '\n')
	if quoted != nil {
		line = append(append(line, quoted...), '\n')
	}
	go s.in.Write(line)
	var res response
	s.read(&res)
	if res.ID != r.ID {
		s.t.Fatalf("response to %d has ID %d", r.ID, res.ID)
	}
	return res
}

func id(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// entry writes action a's entry and output into dir as the go command's
// own cache does.
func entry(t *testing.T, dir string, a []byte, out []byte) {
	t.Helper()
	o := sha256.Sum256(out)
	ah, oh := hex.EncodeToString(a), hex.EncodeToString(o[:])
	for _, f := range []struct{ name, text string }{
		{filepath.Join(ah[:2], ah+"-a"), fmt.Sprintf("v1 %s %s %20d %20d\n", ah, oh, len(out), 0)},
		{filepath.Join(oh[:2], oh+"-d"), string(out)},
	} {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tree is every file under dir with its bytes, to see that a directory
// was not changed.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGetAndPut(t *testing.T) {
	ro, rw := t.TempDir(), filepath.Join(t.TempDir(), "new")
	entry(t, ro, id("in the image"), []byte("archive"))
	before := tree(t, ro)
	s := start(t, ro, rw)

	res := s.send(request{Command: "get", ActionID: id("in the image")}, nil)
	if res.Miss || res.Err != "" || res.Size != 7 || !strings.HasPrefix(res.DiskPath, ro+"/") {
		t.Fatalf("get of the image's entry: %+v, want a hit in %s", res, ro)
	}
	if b, _ := os.ReadFile(res.DiskPath); string(b) != "archive" {
		t.Fatalf("its output reads %q", b)
	}
	if res := s.send(request{Command: "get", ActionID: id("nowhere")}, nil); !res.Miss || res.Err != "" {
		t.Fatalf("get of an unknown action: %+v, want a miss", res)
	}

	body := []byte("built in the job")
	out := sha256.Sum256(body)
	res = s.send(request{Command: "put", ActionID: id("built"), OutputID: out[:], BodySize: int64(len(body))}, body)
	if res.Err != "" || !strings.HasPrefix(res.DiskPath, rw+"/") {
		t.Fatalf("put: %+v, want its output in %s", res, rw)
	}
	res = s.send(request{Command: "get", ActionID: id("built")}, nil)
	if res.Miss || !bytes.Equal(res.OutputID, out[:]) || res.Size != int64(len(body)) || !strings.HasPrefix(res.DiskPath, rw+"/") {
		t.Fatalf("get after put: %+v", res)
	}
	if b, _ := os.ReadFile(res.DiskPath); !bytes.Equal(b, body) {
		t.Fatalf("the put's output reads %q", b)
	}
	// An empty output is a file of no bytes.
	empty := sha256.Sum256(nil)
	if res := s.send(request{Command: "put", ActionID: id("empty"), OutputID: empty[:]}, nil); res.Err != "" {
		t.Fatalf("put of an empty output: %+v", res)
	}
	if res := s.send(request{Command: "get", ActionID: id("empty")}, nil); res.Miss || res.Size != 0 || res.DiskPath == "" {
		t.Fatalf("get of an empty output: %+v", res)
	}
	// A put of what the image holds goes to the writable directory too.
	img := sha256.Sum256([]byte("archive"))
	if res := s.send(request{Command: "put", ActionID: id("in the image"), OutputID: img[:], BodySize: 7}, []byte("archive")); !strings.HasPrefix(res.DiskPath, rw+"/") {
		t.Fatalf("put of the image's entry: %+v", res)
	}

	if res := s.send(request{Command: "close"}, nil); res.Err != "" {
		t.Fatalf("close: %+v", res)
	}
	if err := <-s.done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if after := tree(t, ro); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the read-only directory changed:\n%v\nwas\n%v", after, before)
	}
}

// A large body is decoded on its way to the file, and what follows it is
// read as the next request.
func TestLargeBodyIsStreamed(t *testing.T) {
	rw := t.TempDir()
	s := start(t, t.TempDir(), rw)
	body := make([]byte, 3<<20+7)
	for i := range body {
		body[i] = byte(i * 7)
	}
	out := sha256.Sum256(body)
	res := s.send(request{Command: "put", ActionID: id("large"), OutputID: out[:], BodySize: int64(len(body))}, body)
	if res.Err != "" {
		t.Fatalf("put: %+v", res)
	}
	if b, _ := os.ReadFile(res.DiskPath); !bytes.Equal(b, body) {
		t.Fatalf("the stored output has %d bytes, not the body's %d", len(b), len(body))
	}
	if res := s.send(request{Command: "get", ActionID: id("large")}, nil); res.Miss || res.Size != int64(len(body)) {
		t.Fatalf("get after the large put: %+v", res)
	}
	// A body of another size than announced is refused, and the session
	// goes on.
	res = s.send(request{Command: "put", ActionID: id("short"), OutputID: out[:], BodySize: int64(len(body)) + 1}, body)
	if !strings.Contains(res.Err, "BodySize") {
		t.Fatalf("put of a body shorter than announced: %+v", res)
	}
	if res := s.send(request{Command: "get", ActionID: id("short")}, nil); !res.Miss {
		t.Fatalf("a refused put was stored: %+v", res)
	}
	// A body that is no base64 fails in its middle: refused, read to its
	// end, and the session goes on.
	res = s.sendQuoted(request{Command: "put", ActionID: id("bad"), OutputID: out[:], BodySize: 6}, []byte(`"AAAA!!!!"`))
	if !strings.Contains(res.Err, "illegal base64") {
		t.Fatalf("put of a body that is no base64: %+v", res)
	}
	if res := s.send(request{Command: "get", ActionID: id("large")}, nil); res.Miss {
		t.Fatalf("get after the bad put: %+v", res)
	}
	if n := len(tree(t, rw)); n != 2 {
		t.Errorf("%d files in the writable directory, want the large put's output and entry (no temporary left)", n)
	}
}

func TestBadPutsAreRefused(t *testing.T) {
	s := start(t, t.TempDir(), t.TempDir())
	body := []byte("bytes")
	out := sha256.Sum256(body)
	for name, tc := range map[string]struct {
		r    request
		body []byte
		want string
	}{
		"an output ID not of the body": {request{ActionID: id("a"), OutputID: id("other"), BodySize: 5}, body, "not the SHA-256 of the body"},
		"a short action ID":            {request{ActionID: []byte{1, 2}, OutputID: out[:], BodySize: 5}, body, "must be SHA-256 digests"},
		"no output ID":                 {request{ActionID: id("a"), BodySize: 5}, body, "must be SHA-256 digests"},
	} {
		tc.r.Command = "put"
		if res := s.send(tc.r, tc.body); !strings.Contains(res.Err, tc.want) {
			t.Errorf("%s: %+v, want an error saying %q", name, res, tc.want)
		}
	}
	if res := s.send(request{Command: "get", ActionID: id("a")}, nil); !res.Miss {
		t.Errorf("a refused put was stored: %+v", res)
	}
	if res := s.send(request{Command: "get", ActionID: []byte{1}}, nil); !strings.Contains(res.Err, "action ID of 1 bytes") {
		t.Errorf("get of a short action ID: %+v", res)
	}
	if res := s.send(request{Command: "stat"}, nil); !strings.Contains(res.Err, `unknown command "stat"`) {
		t.Errorf("an unknown command: %+v", res)
	}
}

// An entry not exactly of the go command's form, or whose output is not
// there whole, is a miss (never an error that would fail the build).
func TestDamagedEntriesAreMisses(t *testing.T) {
	ro := t.TempDir()
	a := id("damaged")
	ah := hex.EncodeToString(a)
	entryPath := filepath.Join(ro, ah[:2], ah+"-a")
	out := []byte("output")
	o := sha256.Sum256(out)
	oh := hex.EncodeToString(o[:])
	outPath := filepath.Join(ro, oh[:2], oh+"-d")
	good := fmt.Sprintf("v1 %s %s %20d %20d\n", ah, oh, len(out), 0)
	for name, tc := range map[string]struct{ entry, output string }{
		"whole":                       {good, "output"},
		"output of another size":      {good, "outpu"},
		"no output":                   {good, ""},
		"another action's entry":      {strings.Replace(good, ah, hex.EncodeToString(id("other")), 1), "output"},
		"no newline":                  {strings.TrimSuffix(good, "\n") + " ", "output"},
		"a negative size":             {fmt.Sprintf("v1 %s %s %20d %20d\n", ah, oh, -1, 0), "output"},
		"a negative time":             {fmt.Sprintf("v1 %s %s %20d %20d\n", ah, oh, len(out), -1), "output"},
		"an output ID that is no hex": {strings.Replace(good, oh, strings.Repeat("z", 64), 1), "output"},
		"v2":                          {strings.Replace(good, "v1", "v2", 1), "output"},
		"one byte more":               {good + "x", "output"},
	} {
		t.Run(name, func(t *testing.T) {
			os.RemoveAll(ro)
			for p, text := range map[string]string{entryPath: tc.entry, outPath: tc.output} {
				os.MkdirAll(filepath.Dir(p), 0o755)
				if text != "" {
					if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			res := get(ro, t.TempDir(), a)
			if want := name != "whole"; res.Miss != want || res.Err != "" {
				t.Fatalf("got %+v, want a miss: %v", res, want)
			}
		})
	}
}

// The go command itself, with this program as its GOCACHEPROG: what the
// read-only cache holds is not built again, it is never written, and what
// is built lands in the writable directory and is a hit next time.
func TestTheGoCommandReadsTheCacheInPlace(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	src, ro, rw := filepath.Join(tmp, "src"), filepath.Join(tmp, "ro"), filepath.Join(tmp, "rw")
	os.Mkdir(src, 0o755)
	write := func(text string) {
		for name, b := range map[string]string{"go.mod": "module p\n\ngo 1.22\n", "p.go": text} {
			if err := os.WriteFile(filepath.Join(src, name), []byte(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	build := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(goCmd, "build", "-x", ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOTOOLCHAIN=local", "GOPROXY=off", "GO111MODULE=on", "GOTELEMETRY=off", "GOCACHEPROG=")
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return string(out)
	}
	compiled := func(log string) bool { return strings.Contains(log, "/compile ") }
	prog := []string{"GOCACHE=" + filepath.Join(tmp, "own"), "GOCACHEPROG_TEST_SERVE=1", "GOCACHEPROG=" + self + " " + ro + " " + rw}

	write("package p\n\nfunc F() int { return 1 }\n")
	if log := build("GOCACHE=" + ro); !compiled(log) {
		t.Fatalf("the warm-up build compiled nothing:\n%s", log)
	}
	before := tree(t, ro)
	if log := build(prog...); compiled(log) {
		t.Fatalf("a build the read-only cache holds compiled again:\n%s", log)
	}
	write("package p\n\nfunc F() int { return 2 }\n")
	if log := build(prog...); !compiled(log) {
		t.Fatalf("a changed package was not compiled:\n%s", log)
	}
	if log := build(prog...); compiled(log) {
		t.Fatalf("what the job built was not a hit from the writable directory:\n%s", log)
	}
	if after := tree(t, ro); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("the go command's builds changed the read-only cache")
	}
	if len(tree(t, rw)) == 0 {
		t.Fatal("nothing was put in the writable directory")
	}
}

// A writable directory another uid may have filled is refused before any
// request is answered: its entries would be taken for this build's.
func TestAWritableDirectoryNotItsOwnIsRefused(t *testing.T) {
	ro := t.TempDir()
	mk := func(t *testing.T, mode os.FileMode) string {
		d := filepath.Join(t.TempDir(), "rw")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	refused := func(t *testing.T, rw, want string) {
		t.Helper()
		err := serve(ro, rw, strings.NewReader(""), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("serve over %s: %v, want an error saying %q", rw, err, want)
		}
	}
	t.Run("others may write", func(t *testing.T) { refused(t, mk(t, 0o777), "may be written by other uids") })
	t.Run("its group may write", func(t *testing.T) { refused(t, mk(t, 0o775), "may be written by other uids") })
	t.Run("a link", func(t *testing.T) {
		l := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(mk(t, 0o755), l); err != nil {
			t.Fatal(err)
		}
		refused(t, l, "is not a directory")
	})
	t.Run("another uid's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to give the directory to another uid")
		}
		d := mk(t, 0o755)
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(t, d, "is uid 65534's")
	})
	t.Run("its own", func(t *testing.T) {
		if err := serve(ro, mk(t, 0o755), strings.NewReader(""), io.Discard); err != nil {
			t.Fatalf("its own directory: %v", err)
		}
	})
}
