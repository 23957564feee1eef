package image

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadSpecRefuses(t *testing.T) {
	tests := []struct {
		name, spec, wantErr string
	}{
		{"wrong schema", `{"schema":"sandboxd.image/v0","name":"a","contents":[]}`, `schema: "sandboxd.image/v0" is not`},
		{"bad name", `{"schema":"sandboxd.image/v1","name":"A B","contents":[]}`, `name: "A B" is not a valid repository name`},
		{"unknown field", `{"schema":"sandboxd.image/v1","name":"a","pull":"alpine"}`, `unknown field "pull"`},
		{"relative dst", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"dir","dst":"work"}]}`, `contents[0].dst: "work" is not a clean absolute path`},
		{"unclean dst", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"dir","dst":"/a/../etc"}]}`, `contents[0].dst`},
		{"root dst", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"dir","dst":"/"}]}`, `contents[0].dst`},
		{"unknown type", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"dir","dst":"/a"},{"type":"url","dst":"/b"}]}`, `contents[1].type: unknown type "url"`},
		{"file without src", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"file","dst":"/a"}]}`, `contents[0].src: required for file`},
		{"tree without src", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"tree","dst":"/a"}]}`, `contents[0].src: required for tree`},
		{"symlink without target", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"symlink","dst":"/a"}]}`, `contents[0].target: required`},
		{"volume on a file", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"file","src":"/bin/sh","dst":"/a","volume":true}]}`, `contents[0].volume: only a tree, a gocache or a pycompile`},
		{"volume in the scratch space", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"tree","src":"/usr/share","dst":"/work/share","volume":true}]}`, `overlaps /work`},
		{"volumes nested", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"tree","src":"/usr/share","dst":"/opt","volume":true},{"type":"tree","src":"/usr/share","dst":"/opt/b","volume":true}]}`, `"/opt" and "/opt/b" overlap`},
		{"mode not octal", `{"schema":"sandboxd.image/v1","name":"a","contents":[{"type":"dir","dst":"/a","mode":"0789"}]}`, `contents[0].mode: "0789" is not octal`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(tt.spec), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := LoadSpec(dir)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got spec %+v, error %v; want an error naming %q", s, err, tt.wantErr)
			}
		})
	}
}

// Nothing is placed twice and nothing is placed below a file: the layer
// never depends on which of two entries wins.
func TestCollectRefusesConflicts(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		contents []Content
		wantErr  string
	}{
		{"a file twice", []Content{{Type: "text", Dst: "/a"}, {Type: "file", Src: src, Dst: "/a"}}, "/a is placed twice"},
		{"a link over a file", []Content{{Type: "text", Dst: "/a"}, {Type: "symlink", Dst: "/a", Target: "b"}}, "/a is placed twice"},
		{"below a file", []Content{{Type: "text", Dst: "/a"}, {Type: "text", Dst: "/a/b"}}, "/a is not a directory"},
		{"a directory as a file source", []Content{{Type: "file", Src: filepath.Join(dir, "sub"), Dst: "/a"}}, "is not a regular file"},
		{"a missing source", []Content{{Type: "file", Src: filepath.Join(dir, "none"), Dst: "/a"}}, "no such file"},
	}
	for _, tt := range tests {
		if _, err := collect(&Spec{Name: "t", Contents: tt.contents}); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: got error %v, want one naming %q", tt.name, err, tt.wantErr)
		}
	}
	// A directory placed twice is one directory.
	if _, err := collect(&Spec{Name: "t", Contents: []Content{{Type: "dir", Dst: "/a"}, {Type: "dir", Dst: "/a"}, {Type: "text", Dst: "/a/b"}}}); err != nil {
		t.Errorf("a directory twice: got %v, want it accepted", err)
	}
}

// The images this repository ships load, and name the trees their jobs
// read from volumes where Docker's storage driver is fuse-overlayfs: the
// Go toolchain and build cache, and the Python image's module
// directories (the standard library's and Debian's dist-packages), whose
// listings fuse-overlayfs 1.10 can get wrong (README, "image trees").
func TestShippedImagesNameTheirTrees(t *testing.T) {
	for name, want := range map[string]string{
		"go":      `["/usr/local/go","/usr/local/share/gocache"]`,
		"python":  `["/usr/lib/python3.11","/usr/lib/python3/dist-packages"]`,
		"minimal": "",
	} {
		s, err := LoadSpec(filepath.Join("..", "..", "images", name))
		if err != nil {
			t.Fatalf("images/%s: %v", name, err)
		}
		if got := volumeTrees(s); got != want {
			t.Errorf("images/%s: trees %s, want %s", name, got, want)
		}
	}
}
