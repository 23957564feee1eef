package broker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testdata/tree-image.tar is `docker save` (Docker 20.10) of the image
// `sandboxd image build internal/broker/testdata/tree-image` made; the ID
// below is that image's. To make it again:
//
//	id=$(bin/sandboxd image build -q internal/broker/testdata/tree-image)
//	docker save $id > internal/broker/testdata/tree-image.tar && docker rmi $id
const treeImageID = "sha256:10b5134bafe1255b6a67684a8a2474bbe2df4e37880ebcbdea2e09038e4f47de"

func readTreeImage(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "tree-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func savedFrom(t *testing.T, archive []byte, image string) (*savedImage, error) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "saved-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(archive); err != nil {
		t.Fatal(err)
	}
	layer, err := checkSaved(f, image)
	if err != nil {
		return nil, err
	}
	return &savedImage{f: f, layer: layer}, nil
}

func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestATreeOfASavedImage(t *testing.T) {
	s, err := savedFrom(t, readTreeImage(t), treeImageID)
	if err != nil {
		t.Fatal(err)
	}
	sums, size, err := s.treeSums("/opt/tree")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fileSum{
		rootKey:      {dir: true, mode: 0o755},
		"a.txt":      {mode: 0o644, size: 6, digest: hexSum("hello\n")},
		"empty":      {dir: true, mode: 0o750},
		"link":       {mode: -1, digest: "symlink sub/run.sh"},
		"sub":        {dir: true, mode: 0o755},
		"sub/deeper": {dir: true, mode: 0o755},
		"sub/deeper/x": {
			mode: 0o644, size: 5, digest: hexSum("deep\n"),
		},
		"sub/run.sh": {mode: 0o755, size: 18, digest: hexSum("#!/bin/sh\necho hi\n")},
	}
	if !maps.Equal(sums, want) {
		t.Errorf("tree sums:\n got %v\nwant %v", sums, want)
	}
	if size != 6+5+18 {
		t.Errorf("size %d, want %d", size, 6+5+18)
	}
	// The tar that fills the volume is that tree, relative to it, without
	// its root (set after, as every volume's), and nothing else of the
	// image (/etc/motd).
	rc := s.treeTar("/opt/tree")
	got, err := treeSums(rc, "", true)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	delete(want, rootKey)
	if !maps.Equal(got, want) {
		t.Errorf("the tree's tar:\n got %v\nwant %v", got, want)
	}

	for dir, msg := range map[string]string{
		"/opt/none": "not a directory of the image",
		"/etc/motd": "not a directory of the image",
	} {
		if _, _, err := s.treeSums(dir); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("tree %s: %v, want %q", dir, err, msg)
		}
	}
}

// rewritten is the fixture with its layer's entries edited by layer and
// its config by config (either may be nil), and the ID of the image it
// now holds: what an engine's export of such an image would be.
func rewritten(t *testing.T, layer func(*tar.Writer, *tar.Header) bool, config func(map[string]any)) ([]byte, string) {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(readTreeImage(t)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = b
		}
	}
	var manifest []map[string]any
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	cfgName := manifest[0]["Config"].(string)
	layerName := manifest[0]["Layers"].([]any)[0].(string)
	if layer != nil {
		var out bytes.Buffer
		tw := tar.NewWriter(&out)
		lr := tar.NewReader(bytes.NewReader(files[layerName]))
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !layer(tw, h) {
				continue
			}
			tw.WriteHeader(h)
			io.Copy(tw, lr)
		}
		layer(tw, nil) // the end: add entries
		tw.Close()
		files[layerName] = out.Bytes()
	}
	var cfg map[string]any
	if err := json.Unmarshal(files[cfgName], &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["rootfs"].(map[string]any)["diff_ids"] = []any{"sha256:" + hexSum(string(files[layerName]))}
	if config != nil {
		config(cfg)
	}
	cb, _ := json.Marshal(cfg)
	delete(files, cfgName)
	cfgName = hexSum(string(cb)) + ".json"
	files[cfgName] = cb
	manifest[0]["Config"] = cfgName
	files["manifest.json"], _ = json.Marshal(manifest)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for name, b := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	tw.Close()
	return out.Bytes(), "sha256:" + strings.TrimSuffix(cfgName, ".json")
}

func TestASavedImageIsCheckedAgainstItsID(t *testing.T) {
	orig := readTreeImage(t)
	if _, err := savedFrom(t, orig, "sha256:"+strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "not the image") {
		t.Errorf("another image's ID: %v", err)
	}
	// A layer changed after the config was made: its digest is not the
	// config's diff ID.
	edited := bytes.Replace(orig, []byte("hello\n"), []byte("HELLO\n"), 1)
	if bytes.Equal(edited, orig) {
		t.Fatal("the fixture has no hello")
	}
	if _, err := savedFrom(t, edited, treeImageID); err == nil || !strings.Contains(err.Error(), "its layer is") {
		t.Errorf("an edited layer: %v", err)
	}
	// Rewritten consistently (a new ID), it is that image's tree.
	again, id := rewritten(t, func(tw *tar.Writer, h *tar.Header) bool { return true }, nil)
	if _, err := savedFrom(t, again, id); err != nil {
		t.Errorf("the fixture rewritten: %v", err)
	}
	two, id2 := rewritten(t, nil, func(cfg map[string]any) {
		d := cfg["rootfs"].(map[string]any)["diff_ids"].([]any)
		cfg["rootfs"].(map[string]any)["diff_ids"] = append(d, d[0])
	})
	if _, err := savedFrom(t, two, id2); err == nil || !strings.Contains(err.Error(), "one layer only") {
		t.Errorf("two diff IDs: %v", err)
	}
	if _, err := savedFrom(t, []byte("not a tar at all, and longer than one block of the format; "+strings.Repeat("x", 600)), treeImageID); err == nil {
		t.Error("not a tar: no error")
	}
}

func TestATreeHoldsOnlyDirectoriesFilesAndLinks(t *testing.T) {
	for name, h := range map[string]*tar.Header{
		"a hard link":  {Name: "opt/tree/hard", Typeflag: tar.TypeLink, Linkname: "opt/tree/a.txt"},
		"a device":     {Name: "opt/tree/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		"a whiteout":   {Name: "opt/tree/sub/.wh.gone", Typeflag: tar.TypeReg},
		"twice":        {Name: "opt/tree/a.txt", Typeflag: tar.TypeReg, Mode: 0o644},
		"a link out":   {Name: "opt/tree/sub/out", Typeflag: tar.TypeSymlink, Linkname: "../../../etc/motd"},
		"below a link": {Name: "opt/tree/link/x", Typeflag: tar.TypeReg, Mode: 0o644},
		"no parent":    {Name: "opt/tree/none/x", Typeflag: tar.TypeReg, Mode: 0o644},
	} {
		archive, id := rewritten(t, func(tw *tar.Writer, got *tar.Header) bool {
			if got == nil {
				h.ModTime = time.Unix(0, 0)
				tw.WriteHeader(h)
			}
			return true
		}, nil)
		s, err := savedFrom(t, archive, id)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, _, err := s.treeSums("/opt/tree"); err == nil {
			t.Errorf("%s: served", name)
		}
		// Outside the tree it does not matter.
		if _, _, err := s.treeSums("/opt/tree/sub/deeper"); err != nil {
			t.Errorf("%s: a tree beside it: %v", name, err)
		}
	}
}

func TestTreeVolumesAreNamedByImageAndDirectory(t *testing.T) {
	b := &Broker{cfg: Default()}
	a, c := b.treeVolumeName(treeImageID, "/opt/tree"), b.treeVolumeName(treeImageID, "/opt/other")
	d := b.treeVolumeName("sha256:"+strings.Repeat("1", 64), "/opt/tree")
	if a == c || a == d || !strings.HasPrefix(a, "sandboxd-tree-") || a != b.treeVolumeName(treeImageID, "/opt/tree") {
		t.Errorf("names %s, %s, %s", a, c, d)
	}
}

func TestLockFileIsExclusiveAcrossOpens(t *testing.T) {
	b := &Broker{cfg: Default()}
	b.cfg.CacheDir = t.TempDir()
	unlock, err := b.lockFile(context.Background(), "x.lock")
	if err != nil {
		t.Fatal(err)
	}
	// A second open of the file (as another process's) waits.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := b.lockFile(ctx, "x.lock"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("taken twice: %v", err)
	}
	unlock()
	unlock2, err := b.lockFile(context.Background(), "x.lock")
	if err != nil {
		t.Fatalf("after the unlock: %v", err)
	}
	unlock2()
}

// A tree keeps the image's owners, and its links may point anywhere
// within it or by absolute path (resolved in the sandbox, as in the image).
func TestATreeKeepsOwnersAndLinks(t *testing.T) {
	archive, id := rewritten(t, func(tw *tar.Writer, h *tar.Header) bool {
		if h == nil {
			for _, e := range []*tar.Header{
				{Name: "opt/tree/owned", Typeflag: tar.TypeReg, Mode: 0o640, Uid: 1000, Gid: 1001},
				{Name: "opt/tree/sub/up", Typeflag: tar.TypeSymlink, Linkname: "../a.txt"},
				{Name: "opt/tree/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/motd"},
			} {
				e.ModTime = time.Unix(0, 0)
				tw.WriteHeader(e)
			}
		}
		return true
	}, nil)
	s, err := savedFrom(t, archive, id)
	if err != nil {
		t.Fatal(err)
	}
	sums, _, err := s.treeSums("/opt/tree")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fileSum{
		"owned":  {mode: 0o640, digest: hexSum(""), uid: 1000, gid: 1001},
		"sub/up": {mode: -1, digest: "symlink ../a.txt"},
		"abs":    {mode: -1, digest: "symlink /etc/motd"},
	} {
		if sums[name] != want {
			t.Errorf("%s: %+v, want %+v", name, sums[name], want)
		}
	}
	// The tar that fills the volume carries the owner (extracted with it).
	rc := s.treeTar("/opt/tree")
	got, err := treeSums(rc, "", true)
	rc.Close()
	if err != nil || got["owned"] != sums["owned"] {
		t.Errorf("the tree's tar: %+v, %v; want %+v", got["owned"], err, sums["owned"])
	}
}

func TestFirstDifferenceNamesThePath(t *testing.T) {
	want := map[string]fileSum{
		rootKey: {dir: true, mode: 0o750, gid: 65534},
		"a":     {mode: 0o644, size: 1, digest: "ca97"},
		"l":     {mode: -1, digest: "symlink a"},
	}
	for _, tt := range []struct {
		got  map[string]fileSum
		want string
	}{
		{map[string]fileSum{rootKey: {dir: true, mode: 0o755}, "a": want["a"], "l": want["l"]}, ". is directory 0755 0:0, want directory 0750 0:65534"},
		{map[string]fileSum{rootKey: want[rootKey], "l": want["l"]}, "a missing"},
		{map[string]fileSum{rootKey: want[rootKey], "a": want["a"], "l": want["l"], "b": {mode: 0o600}}, "b not expected"},
		{map[string]fileSum{rootKey: want[rootKey], "a": {mode: 0o644, size: 2, digest: "ffff"}, "l": want["l"]}, "a is file 0644 0:0, 2 bytes, sha256 ffff, want file 0644 0:0, 1 bytes, sha256 ca97"},
		{map[string]fileSum{rootKey: want[rootKey], "a": want["a"], "l": {mode: -1, digest: "symlink b"}}, "l is symlink b, want symlink a"},
		{want, "no difference"},
	} {
		if got := firstDifference(tt.got, want); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}
