package helper

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// collected is what the collector sent, decoded from its frames.
type collected struct {
	files    map[string]string // path -> content
	order    []string
	rejected []shim.Rejected
	summary  shim.CollectSummary
}

func collect(t *testing.T, cfg *shim.Config) collected {
	t.Helper()
	var buf bytes.Buffer
	if code := collectFrames(&buf, cfg); code != 0 {
		t.Fatalf("collectFrames exited %d", code)
	}
	got := collected{files: map[string]string{}}
	fr := shim.NewFrameReader(&buf)
	var cur *shim.FileHeader
	var data []byte
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			t.Fatal("stream ended without a summary")
		}
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case shim.FrameFileBegin:
			cur = &shim.FileHeader{}
			if err := json.Unmarshal(p, cur); err != nil {
				t.Fatal(err)
			}
			data = nil
		case shim.FrameFileData:
			data = append(data, p...)
		case shim.FrameFileEnd:
			if int64(len(data)) != cur.Size {
				t.Fatalf("%s: header said %d bytes, got %d", cur.Path, cur.Size, len(data))
			}
			got.files[cur.Path] = string(data)
			got.order = append(got.order, cur.Path)
			cur = nil
		case shim.FrameRejected:
			var r shim.Rejected
			if err := json.Unmarshal(p, &r); err != nil {
				t.Fatal(err)
			}
			got.rejected = append(got.rejected, r)
		case shim.FrameCollected:
			if err := json.Unmarshal(p, &got.summary); err != nil {
				t.Fatal(err)
			}
			if _, _, err := fr.Next(); err != io.EOF {
				t.Fatalf("after the summary: got %v, want the end", err)
			}
			return got
		default:
			t.Fatalf("unexpected frame %q", typ)
		}
	}
}

// tree makes files ("name": content), directories ("name/") and links
// ("name@": target) below root.
func tree(t *testing.T, root string, entries map[string]string) {
	t.Helper()
	for name, v := range entries {
		p := filepath.Join(root, strings.TrimRight(name, "/@"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasSuffix(name, "@"):
			err = os.Symlink(v, p)
		default:
			err = os.WriteFile(p, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func reasons(rs []shim.Rejected) map[string]string {
	m := map[string]string{}
	for _, r := range rs {
		m[r.Path] = r.Reason
	}
	return m
}

func TestCollectRegularFilesOnly(t *testing.T) {
	root := t.TempDir()
	out := filepath.Join(root, "out")
	secret := filepath.Join(root, "secret")
	tree(t, root, map[string]string{
		"secret":            "not an output",
		"out/b.txt":         "bee",
		"out/a.txt":         "a",
		"out/sub/deep/c":    "sea",
		"out/empty":         "",
		"out/emptydir/":     "",
		"out/link@":         secret,
		"out/dirlink@":      root,
		"out/dangling@":     filepath.Join(root, "nothing"),
		"out/sub/uplink@":   "../../secret",
		"out/bad\nname":     "x",
		"out/\x1b[2Jclear":  "x",
		"out/sub/good name": "spaces are fine",
	})
	if err := unix.Mkfifo(filepath.Join(out, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		if err := unix.Mknod(filepath.Join(out, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("unix", filepath.Join(out, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	got := collect(t, &shim.Config{Outputs: []string{out}, OutputBytes: 1 << 20, FileCount: 100})

	wantFiles := map[string]string{
		out + "/a.txt":         "a",
		out + "/b.txt":         "bee",
		out + "/empty":         "",
		out + "/sub/deep/c":    "sea",
		out + "/sub/good name": "spaces are fine",
	}
	if !reflect.DeepEqual(got.files, wantFiles) {
		t.Errorf("collected files:\n got %v\nwant %v", got.files, wantFiles)
	}
	// Sorted at every level: the stream is the same for the same tree.
	wantOrder := []string{out + "/a.txt", out + "/b.txt", out + "/empty", out + "/sub/deep/c", out + "/sub/good name"}
	if !reflect.DeepEqual(got.order, wantOrder) {
		t.Errorf("order:\n got %v\nwant %v", got.order, wantOrder)
	}
	wantRejected := map[string]string{
		out + "/link":       "symbolic link (never followed)",
		out + "/dirlink":    "symbolic link (never followed)",
		out + "/dangling":   "symbolic link (never followed)",
		out + "/sub/uplink": "symbolic link (never followed)",
		out + "/fifo":       "FIFO",
		out + "/sock":       "socket",
		out + "/bad?name":   "unacceptable name (control character or invalid UTF-8)",
		out + "/?[2Jclear":  "unacceptable name (control character or invalid UTF-8)",
	}
	if os.Getuid() == 0 {
		wantRejected[out+"/null"] = "device node"
	}
	if r := reasons(got.rejected); !reflect.DeepEqual(r, wantRejected) {
		t.Errorf("rejected:\n got %v\nwant %v", r, wantRejected)
	}
	wantSum := shim.CollectSummary{Files: 5, Bytes: int64(len("a" + "bee" + "sea" + "spaces are fine")), LimitsHit: []string{}}
	if !reflect.DeepEqual(got.summary, wantSum) {
		t.Errorf("summary: got %+v, want %+v", got.summary, wantSum)
	}
}

// A file whose path is longer than the signed result allows an artifact's
// is rejected, not collected, and so is a directory whose path already is:
// once, without what is below it.
func TestCollectRejectsPathsOverTheBound(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	// name is a path below out that makes out+"/"+name n bytes long.
	name := func(n int, last string) string {
		rest := n - len(out) - 1
		var parts []string
		for rest > 255 {
			parts = append(parts, strings.Repeat("d", 200))
			rest -= 201
		}
		return strings.Join(append(parts, strings.Repeat(last, rest)), "/")
	}
	at, over, dir := name(shim.MaxArtifactPath, "f"), name(shim.MaxArtifactPath+1, "f"), name(shim.MaxArtifactPath+1, "g")
	tree(t, out, map[string]string{at: "at the bound", over: "over it", dir + "/f": "below a directory over it"})

	got := collect(t, &shim.Config{Outputs: []string{out}, OutputBytes: 1 << 20, FileCount: 100})

	if want := map[string]string{out + "/" + at: "at the bound"}; !reflect.DeepEqual(got.files, want) {
		t.Errorf("collected files %v, want only the one at the bound", got.files)
	}
	wantRejected := map[string]string{
		out + "/" + over: "path longer than 1024 bytes",
		out + "/" + dir:  "path longer than 1024 bytes",
	}
	if r := reasons(got.rejected); !reflect.DeepEqual(r, wantRejected) {
		t.Errorf("rejected:\n got %v\nwant %v", r, wantRejected)
	}
}

// No component of an output directory's path may be a link.
func TestCollectRefusesLinkedOutputDirectories(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{
		"real/out/f": "through a link",
		"out@":       filepath.Join(root, "real", "out"),
		"parent@":    filepath.Join(root, "real"),
	})
	for _, dir := range []string{filepath.Join(root, "out"), filepath.Join(root, "parent", "out")} {
		got := collect(t, &shim.Config{Outputs: []string{dir}, OutputBytes: 1 << 20, FileCount: 100})
		if len(got.files) != 0 {
			t.Errorf("%s: got files %v, want none", dir, got.files)
		}
		if len(got.rejected) != 1 || got.rejected[0].Path != dir || !strings.Contains(got.rejected[0].Reason, "output directory") {
			t.Errorf("%s: got rejected %+v, want the output directory refused", dir, got.rejected)
		}
	}
}

func TestCollectMissingOutputIsEmpty(t *testing.T) {
	got := collect(t, &shim.Config{Outputs: []string{filepath.Join(t.TempDir(), "never-made")}, OutputBytes: 1, FileCount: 1})
	if len(got.files) != 0 || len(got.rejected) != 0 || got.summary.Files != 0 {
		t.Errorf("got files %v, rejected %v, summary %+v, want nothing", got.files, got.rejected, got.summary)
	}
}

func TestCollectLimits(t *testing.T) {
	tests := []struct {
		name       string
		files      map[string]string
		count      int64
		bytes      int64
		wantFiles  []string
		wantLimits []string
		wantNote   string // the counted (not listed) rejection
	}{
		{"within", map[string]string{"a": "12", "b": "34"}, 2, 4, []string{"a", "b"}, []string{}, ""},
		{"file count", map[string]string{"a": "1", "b": "2", "c": "3"}, 2, 100, []string{"a", "b"}, []string{"file_count"},
			"1 regular files not collected: file_count limit reached"},
		{"output bytes", map[string]string{"a": "123", "b": "4567890", "c": "x"}, 10, 4, []string{"a", "c"}, []string{"output_bytes"},
			"1 regular files not collected: output_bytes limit reached"},
		{"a file exactly at the byte budget", map[string]string{"a": "1234"}, 10, 4, []string{"a"}, []string{}, ""},
		{"zero files allowed", map[string]string{"a": ""}, 0, 4, nil, []string{"file_count"},
			"1 regular files not collected: file_count limit reached"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			tree(t, out, tt.files)
			got := collect(t, &shim.Config{Outputs: []string{out}, OutputBytes: tt.bytes, FileCount: tt.count})
			var names []string
			for _, p := range got.order {
				names = append(names, filepath.Base(p))
			}
			if !reflect.DeepEqual(names, tt.wantFiles) {
				t.Errorf("got files %v, want %v", names, tt.wantFiles)
			}
			if !reflect.DeepEqual(got.summary.LimitsHit, tt.wantLimits) {
				t.Errorf("got limits %v, want %v", got.summary.LimitsHit, tt.wantLimits)
			}
			var note string
			for _, r := range got.rejected {
				if r.Path == "" {
					note = r.Reason
				}
			}
			if note != tt.wantNote {
				t.Errorf("got counted rejection %q, want %q", note, tt.wantNote)
			}
		})
	}
}

// A flood of refused entries is listed up to a bound, then counted.
func TestCollectBoundsTheRejectedList(t *testing.T) {
	out := t.TempDir()
	const links = shim.MaxRejectedFrames + 7
	for i := range links {
		if err := os.Symlink("/", filepath.Join(out, fmt.Sprintf("l%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, &shim.Config{Outputs: []string{out}, OutputBytes: 1, FileCount: 1})
	if len(got.rejected) != shim.MaxRejectedFrames+1 {
		t.Fatalf("got %d rejected frames, want %d", len(got.rejected), shim.MaxRejectedFrames+1)
	}
	last := got.rejected[len(got.rejected)-1]
	if want := "7 more rejected entries not listed"; last.Path != "" || last.Reason != want {
		t.Errorf("got last rejection %+v, want %q", last, want)
	}
}

func TestCollectStopsBelowMaxDepth(t *testing.T) {
	out := t.TempDir()
	deep := out
	for i := 0; i <= maxDepth+1; i++ {
		deep = filepath.Join(deep, "d")
	}
	tree(t, deep, map[string]string{"f": "too deep"})
	got := collect(t, &shim.Config{Outputs: []string{out}, OutputBytes: 100, FileCount: 100})
	if len(got.files) != 0 {
		t.Errorf("got files %v, want none below %d levels", got.order, maxDepth)
	}
	if len(got.rejected) != 1 || got.rejected[0].Reason != "deeper than 64 levels" {
		t.Errorf("got rejected %+v, want one deeper than 64 levels", got.rejected)
	}
}

// The file-size scan decides whether file_size_bytes was hit: a scratch
// file at the limit means a write was cut short.
func TestScratchFileSizeLimit(t *testing.T) {
	needRoot(t, "to give files to another uid")
	const codeUID = 3999920
	tests := []struct {
		name    string
		files   map[string]string
		codeOwn string // a file (name) given to the code uid
		want    bool
	}{
		{"below the limit", map[string]string{"a": "123", "d/b": "456"}, "", false},
		{"at the limit", map[string]string{"a": "123", "d/b": "4567"}, "", true},
		{"over the limit, deep", map[string]string{"d/e/f/g": "4567890"}, "", true},
		{"a link to a big file is not followed", map[string]string{"big@": "/proc/self/exe"}, "", false},
		{"the code uid's file does not count", map[string]string{"prog-output": "4567"}, "prog-output", false},
		{"the job's own file still counts next to it", map[string]string{"prog-output": "4567", "mine": "4567"}, "prog-output", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scratch := t.TempDir()
			tree(t, scratch, tt.files)
			if tt.codeOwn != "" {
				if err := os.Lchown(filepath.Join(scratch, tt.codeOwn), codeUID, codeUID); err != nil {
					t.Fatal(err)
				}
			}
			got := collect(t, &shim.Config{Scratch: []string{scratch}, FileSize: 4, CodeUID: codeUID})
			hit := reflect.DeepEqual(got.summary.LimitsHit, []string{"file_size_bytes"})
			if hit != tt.want {
				t.Errorf("got limits %v, want file_size_bytes hit %v", got.summary.LimitsHit, tt.want)
			}
		})
	}
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, h.Name); err != nil { // each file holds its name
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func reg(name string, mode int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}
}
func dir(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }

func TestExtract(t *testing.T) {
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	dst := t.TempDir()
	tb := tarOf(t, dir("src/"), reg("src/main.go", 0o600), reg("src/run.sh", 0o700), dir("src/pkg"), reg("src/pkg/x.go", 0o644), reg("top", 0o4755))
	if err := extract(dst, bytes.NewReader(tb)); err != nil {
		t.Fatalf("extract: %v", err)
	}
	tests := []struct {
		name string
		mode os.FileMode
	}{
		{"src", os.ModeDir | 0o755},
		{"src/main.go", 0o644}, // the tar's own modes are not kept: no setuid, no private files
		{"src/run.sh", 0o755},
		{"src/pkg", os.ModeDir | 0o755},
		{"src/pkg/x.go", 0o644},
		{"top", 0o755},
	}
	for _, tt := range tests {
		st, err := os.Lstat(filepath.Join(dst, tt.name))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if st.Mode() != tt.mode {
			t.Errorf("%s: got mode %v, want %v", tt.name, st.Mode(), tt.mode)
		}
		if !st.IsDir() {
			if b, _ := os.ReadFile(filepath.Join(dst, tt.name)); string(b) != tt.name {
				t.Errorf("%s: got content %q, want %q", tt.name, b, tt.name)
			}
		}
	}
}

func TestExtractRefuses(t *testing.T) {
	tests := []struct {
		name    string
		entries []*tar.Header
		before  map[string]string // made in dst first
		wantErr string
	}{
		{"parent escape", []*tar.Header{reg("../escape", 0o644)}, nil, `"../escape" is not a local path`},
		{"escape below a directory", []*tar.Header{dir("a/"), reg("a/../../escape", 0o644)}, nil, "not a local path"},
		{"absolute path", []*tar.Header{reg("/escape", 0o644)}, nil, "not a local path"},
		{"symbolic link", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, nil, "not a directory or regular file"},
		{"hard link", []*tar.Header{reg("f", 0o644), {Name: "h", Typeflag: tar.TypeLink, Linkname: "f"}}, nil, "not a directory or regular file"},
		{"device", []*tar.Header{{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, nil, "not a directory or regular file"},
		{"fifo", []*tar.Header{{Name: "p", Typeflag: tar.TypeFifo}}, nil, "not a directory or regular file"},
		{"the same file twice", []*tar.Header{reg("f", 0o644), reg("f", 0o644)}, nil, "file exists"},
		{"a file over an existing link", []*tar.Header{reg("l", 0o644)}, map[string]string{"l@": "/dev/null"}, "file exists"},
		{"a directory over an existing link", []*tar.Header{dir("l/")}, map[string]string{"l@": "/tmp"}, `entry "l/": not a directory`},
		{"a directory over a file", []*tar.Header{reg("f", 0o644), dir("f/")}, nil, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dst := filepath.Join(root, "dst")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			tree(t, dst, tt.before)
			err := extract(dst, bytes.NewReader(tarOf(t, tt.entries...)))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got error %v, want one naming %q", err, tt.wantErr)
			}
			if _, err := os.Lstat(filepath.Join(root, "escape")); err == nil {
				t.Errorf("a file was written outside the destination")
			}
		})
	}
}

// The input's directory is opened without following a link on the way
// to it (every name is then made relative to it): a destination reached
// through one is refused, nothing is written where the link points.
func TestExtractRefusesADestinationThroughALink(t *testing.T) {
	root := t.TempDir()
	elsewhere := filepath.Join(root, "elsewhere")
	if err := os.MkdirAll(filepath.Join(elsewhere, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{filepath.Join(root, "link"), filepath.Join(root, "link", "sub")} {
		err := extract(dst, bytes.NewReader(tarOf(t, reg("f", 0o644))))
		if err == nil || !strings.Contains(err.Error(), dst) {
			t.Errorf("extract into %s: %v, want refused naming it", dst, err)
		}
	}
	for _, d := range []string{elsewhere, filepath.Join(elsewhere, "sub")} {
		if _, err := os.Lstat(filepath.Join(d, "f")); err == nil {
			t.Errorf("written through the link into %s", d)
		}
	}
}

// The stage child extracts the inputs it is sent and succeeds only on
// the broker's go-ahead after the last one: without it (the broker's
// check failed, it closed stdin) or with another byte there, it fails,
// and the helper runs nothing.
func TestStageRunsOnOnlyAfterTheGoAhead(t *testing.T) {
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "main.go", Mode: 0o644, Size: 5, Format: tar.FormatPAX})
	tw.Write([]byte("hello"))
	tw.Close()
	for _, c := range []struct {
		name  string
		after []byte
		ok    bool
	}{
		{"go-ahead", []byte{shim.GoAhead}, true},
		{"none", nil, false},
		{"another byte", []byte{'x'}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), "ws")
			cfg, _ := json.Marshal(&shim.Config{Inputs: []string{ws}})
			var stdin bytes.Buffer
			shim.WriteInputHeader(&stdin, int64(tarball.Len()))
			stdin.Write(tarball.Bytes())
			stdin.Write(c.after)
			cmd := exec.Command(os.Args[0], "stage")
			cmd.Stdin = &stdin
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := runChild(cmd, cfg)
			if got, _ := os.ReadFile(filepath.Join(ws, "main.go")); string(got) != "hello" {
				t.Fatalf("the input was not extracted: %q", got)
			}
			if c.ok && err != nil {
				t.Fatalf("with the go-ahead: %v (%s)", err, stderr.String())
			}
			if !c.ok && (err == nil || !strings.Contains(stderr.String(), "no go-ahead")) {
				t.Fatalf("without the go-ahead: %v (%s), want a failure naming it", err, stderr.String())
			}
		})
	}
}
