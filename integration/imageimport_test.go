package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandboxd/sandboxd/internal/image"
)

// An image saved by the engine (what `docker save` writes) and removed
// imports back under the same ID; so does the same image as an OCI
// image-layout archive; a tar that is neither is refused.
func TestImageImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	id, saved := savedImage(t, ctx, t.Name())

	got, err := image.Import(ctx, env.Docker, bytes.NewReader(saved), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(t, id) })
	if got != id {
		t.Fatalf("import: got %s, want %s", got, id)
	}
	if _, err := env.Docker.ImageInspect(ctx, id); err != nil {
		t.Fatalf("imported image: %v", err)
	}

	removeImage(t, id)
	got, err = image.Import(ctx, env.Docker, bytes.NewReader(ociLayout(t, saved)), t.TempDir())
	if err != nil {
		t.Fatalf("OCI layout: %v", err)
	}
	if got != id {
		t.Fatalf("OCI layout: got %s, want %s", got, id)
	}

	var notImage bytes.Buffer
	tw := tar.NewWriter(&notImage)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	for name, in := range map[string][]byte{"a tar of a file": notImage.Bytes(), "not a tar": []byte("hello\n")} {
		if _, err := image.Import(ctx, env.Docker, bytes.NewReader(in), t.TempDir()); !errors.Is(err, image.ErrNotImageArchive) {
			t.Errorf("%s: got %v, want ErrNotImageArchive", name, err)
		}
	}
}

// savedImage builds an image of its own, saves it as the engine does for
// `docker save`, and removes it from the engine.
func savedImage(t *testing.T, ctx context.Context, marker string) (string, []byte) {
	dir := t.TempDir()
	spec := `{"schema":"sandboxd.image/v1","name":"sandboxd/it-import","env":["PATH=/bin"],"contents":[
		{"type":"file","src":"/bin/busybox","dst":"/bin/busybox","mode":"0755"},
		{"type":"text","dst":"/etc/marker","text":"` + marker + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := image.Build(ctx, env.Docker, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(t, b.ID) })
	res, err := env.Docker.ImageSave(ctx, []string{b.ID})
	if err != nil {
		t.Fatal(err)
	}
	saved, err := io.ReadAll(res)
	res.Close()
	if err != nil {
		t.Fatal(err)
	}
	removeImage(t, b.ID)
	if _, err := env.Docker.ImageInspect(ctx, b.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("image still present after removal: %v", err)
	}
	return b.ID, saved
}

// ociLayout repacks a docker-archive of one image as an OCI image layout.
func ociLayout(t *testing.T, saved []byte) []byte {
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(saved))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	var m []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(files["manifest.json"], &m); err != nil || len(m) != 1 {
		t.Fatalf("docker save manifest: %v %s", err, files["manifest.json"])
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	put := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	blob := func(mediaType string, b []byte) map[string]any {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(b))
		put("blobs/sha256/"+d[len("sha256:"):], b)
		return map[string]any{"mediaType": mediaType, "digest": d, "size": len(b)}
	}
	var layers []map[string]any
	for _, l := range m[0].Layers {
		layers = append(layers, blob("application/vnd.oci.image.layer.v1.tar", files[l]))
	}
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": blob("application/vnd.oci.image.config.v1+json", files[m[0].Config]), "layers": layers,
	})
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{blob("application/vnd.oci.image.manifest.v1+json", manifest)}})
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", index)
	tw.Close()
	return out.Bytes()
}
