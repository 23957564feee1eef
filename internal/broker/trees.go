package broker

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	images "github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Image trees: the directories an image names in sandbox.ImageTreesLabel
// (the Go image: its toolchain and its warmed build cache) are mounted
// read-only into its jobs from volumes the broker fills from the image
// itself, where the engine's storage driver is fuse-overlayfs. There every
// lookup in the image is a round trip through a FUSE daemon, and version
// 1.10 of it (Debian 12's) can list an entry of a large directory twice or
// leave one out (fixed upstream in 1.16): the Go toolchain then refuses a
// package of its own, and a grader's report goes missing (see README). A
// volume is a directory of the engine's host, bind-mounted.
//
// Nothing about what a job reads changes: a tree's volume holds exactly
// the image layer's tree, checked entry by entry (type, mode, owner, size,
// content digest, link target) against the layer the engine exports, whose
// digest the image's config pins (rootfs.diff_ids), whose digest is the
// image ID. A volume that fails the check is filled again, never used.

// Values of Config.ImageTrees.
const (
	ImageTreesAuto = ""    // on where the engine's storage driver is fuse-overlayfs
	ImageTreesOn   = "on"  // on whatever the driver (Docker only: it exports images)
	ImageTreesOff  = "off" // never: jobs read the image's trees in the image
)

// fuseOverlayfs is the storage driver image trees serve by default.
const fuseOverlayfs = "fuse-overlayfs"

// LabelTree is the directory of the image a tree volume holds; its
// LabelDigest is the image ID.
const LabelTree = "sandboxd.tree"

// imageSaver is an engine that exports images (Docker: `docker save`).
type imageSaver interface {
	ImageSave(ctx context.Context, imageIDs []string, opts ...client.ImageSaveOption) (client.ImageSaveResult, error)
}

// imageTrees returns the directories of image served from volumes on this
// engine, or none. Images are immutable by ID, so an answer is kept.
func (b *Broker) imageTrees(ctx context.Context, image string) ([]string, error) {
	if b.cfg.ImageTrees == ImageTreesOff {
		return nil, nil
	}
	if b.cfg.ImageTrees == ImageTreesAuto {
		h, err := b.hostLimitsOf(ctx)
		if err != nil {
			return nil, err
		}
		if h.driver != fuseOverlayfs {
			return nil, nil
		}
	}
	b.hostMu.Lock()
	trees, ok := b.trees[image]
	b.hostMu.Unlock()
	if ok {
		return trees, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	img, err := b.eng.ImageInspect(ctx, image)
	if err != nil {
		return nil, fmt.Errorf("image %s: inspect: %w", image, err)
	}
	if img.Config != nil && img.Config.Labels[sandbox.ImageTreesLabel] != "" {
		trees, err = sandbox.ParseImageTrees(img.Config.Labels[sandbox.ImageTreesLabel])
		if err != nil {
			return nil, fmt.Errorf("image %s: %w: %w", image, sandbox.ErrImageRefused, err)
		}
		if n := len(img.RootFS.Layers); n != 1 {
			return nil, fmt.Errorf("image %s: %w: label %s names trees, but the image has %d layers (a tree is served from an image of one layer only)", image, sandbox.ErrImageRefused, sandbox.ImageTreesLabel, n)
		}
		if _, ok := b.eng.(imageSaver); !ok {
			return nil, fmt.Errorf("image %s: its trees cannot be served from volumes: this engine does not export images (image trees are Docker's; turn them off or to auto)", image)
		}
	}
	b.hostMu.Lock()
	if b.trees == nil {
		b.trees = map[string][]string{}
	}
	b.trees[image] = trees
	b.hostMu.Unlock()
	return trees, nil
}

// treeVolumeName names the volume of one tree of one image.
func (b *Broker) treeVolumeName(image, dir string) string {
	return b.cfg.VolumePrefix + "-tree-" + treeKey(image, dir)[:32]
}

// treeKey is what a check record of a tree's volume names: the image ID
// pins the tree's every byte.
func treeKey(image, dir string) string {
	sum := sha256.Sum256([]byte("image tree\x00" + image + "\x00" + dir))
	return hex.EncodeToString(sum[:])
}

// ensureTrees makes the volumes of image's trees ready. The image is
// exported only if one of them must be filled or read back. Processes of
// this state take turns at that (a lock file in CacheDir: one export, one
// fill); a process of another state waits in ensure for the fill of the
// process that created the volume.
func (b *Broker) ensureTrees(ctx context.Context, image string, trees []string) error {
	if len(trees) == 0 {
		return nil
	}
	// Checked before (by this process, or one of this state): no lock.
	ready := true
	for _, dir := range trees {
		_, err := b.volumes.ensure(ctx, b.treeVolumeName(image, dir), image, treeKey(image, dir), func() (volumeSource, error) {
			return volumeSource{}, errUnchecked
		})
		if errors.Is(err, errUnchecked) {
			ready = false
			break
		}
		if err != nil {
			return fmt.Errorf("tree %s of image %s: %w", dir, image, err)
		}
	}
	if ready {
		return nil
	}
	unlock, err := b.lockFile(ctx, "tree-"+strings.TrimPrefix(image, "sha256:")+".lock")
	if err != nil {
		return fmt.Errorf("trees of image %s: %w", image, err)
	}
	defer unlock()
	var saved *savedImage
	defer func() {
		if saved != nil {
			saved.Close()
		}
	}()
	for _, dir := range trees {
		name := b.treeVolumeName(image, dir)
		populated, err := b.volumes.ensure(ctx, name, image, treeKey(image, dir), func() (volumeSource, error) {
			if saved == nil {
				s, err := b.saveImage(ctx, image)
				if err != nil {
					return volumeSource{}, err
				}
				saved = s
			}
			sums, size, err := saved.treeSums(dir)
			if err != nil {
				return volumeSource{}, err
			}
			return volumeSource{
				labels: map[string]string{LabelRole: roleTree, LabelDigest: image, LabelTree: dir, LabelBroker: b.cfg.Name, LabelSize: strconv.FormatInt(size, 10)},
				sums:   sums, owners: true,
				open: func() (io.ReadCloser, error) { return saved.treeTar(dir), nil },
				// Filling the Go image's trees takes ~10 s, longer under
				// load: another process's fill is waited for that long,
				// looked for every 2 s (a container list; the volume is
				// read once after).
				settle: 3 * time.Minute, settleEvery: 2 * time.Second,
			}, nil
		})
		if populated {
			b.stats.VolumesPopulated.Add(1)
			b.log.Info("filled a volume with a tree of the image", "volume", name, "image", image, "tree", dir)
		}
		if err != nil {
			return fmt.Errorf("tree %s of image %s: %w", dir, image, err)
		}
	}
	return nil
}

// errUnchecked stops a look at a tree's volume that would need the image.
var errUnchecked = errors.New("not checked yet")

// lockFile takes an exclusive lock on CacheDir/name for this process, or
// nothing if there is no CacheDir. It waits while ctx lets it.
func (b *Broker) lockFile(ctx context.Context, name string) (func(), error) {
	dir := b.cfg.CacheDir
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases it
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			f.Close()
			return nil, fmt.Errorf("waiting for another process of this broker (lock %s): %w", f.Name(), err)
		}
	}
}

// savedImage is an image as the engine exports it, in an unlinked
// temporary file, with its one layer found and checked against the image
// ID.
type savedImage struct {
	f     *os.File
	layer *io.SectionReader
}

func (s *savedImage) Close() error { return s.f.Close() }

// saveImage exports image from the engine and checks it (checkSaved).
func (b *Broker) saveImage(ctx context.Context, image string) (*savedImage, error) {
	eng, ok := b.eng.(imageSaver)
	if !ok {
		return nil, errors.New("this engine cannot export images, so it cannot serve their trees from volumes (set image trees off)")
	}
	img, err := b.eng.ImageInspect(ctx, image)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	// The export is the layer and a few small files: bounded by the
	// image's size (its files' bytes), with room for the headers and
	// padding of two tar levels, which many small files make large.
	most := 2*img.Size + 256<<20
	rc, err := eng.ImageSave(ctx, []string{image})
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	defer rc.Close()
	// Beside the check records (the state directory: a disk, where the
	// system's temporary directory may be memory), else there.
	dir := b.cfg.CacheDir
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	f, err := os.CreateTemp(dir, ".image-*.tar")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name()) // nothing left behind, whatever happens next
	n, err := io.Copy(f, io.LimitReader(rc, most+1))
	if err == nil && n > most {
		err = fmt.Errorf("more than %d bytes for an image of %d", most, img.Size)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("export: %w", err)
	}
	layer, err := checkSaved(f, image)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("the engine's export: %w", err)
	}
	return &savedImage{f: f, layer: layer}, nil
}

// checkSaved finds the layer of a one-layer image in an image archive as
// the engine exports it (image.Saved) and checks it: the config's digest
// is the image ID, and the layer's bytes as stored hash to the config's
// one diff ID.
func checkSaved(f *os.File, image string) (*io.SectionReader, error) {
	config, layers, err := images.Saved(f)
	if err != nil {
		return nil, err
	}
	if got := fmt.Sprintf("sha256:%x", sha256.Sum256(config)); got != image {
		return nil, fmt.Errorf("its config is %s, not the image %s (an engine whose image IDs are not config digests, such as Docker's containerd image store, cannot serve image trees)", got, image)
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(cfg.RootFS.DiffIDs) != 1 || len(layers) != 1 {
		return nil, fmt.Errorf("%d layers (%d diff IDs): a tree is served from an image of one layer only", len(layers), len(cfg.RootFS.DiffIDs))
	}
	layer := layers[0]
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(layer, 0, layer.Size())); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if got := fmt.Sprintf("sha256:%x", h.Sum(nil)); got != cfg.RootFS.DiffIDs[0] {
		return nil, fmt.Errorf("its layer is %s, not the config's %s", got, cfg.RootFS.DiffIDs[0])
	}
	return layer, nil
}

// inTree returns the path of a layer entry relative to dir ("." for dir
// itself), or false if it is not in it.
func inTree(h *tar.Header, dir string) (string, bool) {
	name := strings.TrimSuffix(strings.TrimPrefix(path.Clean("/"+h.Name), "/"), "/")
	d := strings.TrimPrefix(dir, "/")
	if name == d {
		return rootKey, true
	}
	return strings.CutPrefix(name, d+"/")
}

// treeSums lists the tree of the layer at dir, with owners, and the bytes
// of its files. A tree holds directories, regular files and symbolic
// links: anything else (a hard link, a device, a whiteout) is refused.
func (s *savedImage) treeSums(dir string) (map[string]fileSum, int64, error) {
	sums := map[string]fileSum{}
	var size int64
	tr := tar.NewReader(io.NewSectionReader(s.layer, 0, s.layer.Size()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("layer: %w", err)
		}
		rel, ok := inTree(h, dir)
		if !ok {
			continue
		}
		switch {
		case rel == rootKey && h.Typeflag != tar.TypeDir:
			return nil, 0, fmt.Errorf("%s is not a directory of the image", dir)
		case h.Typeflag != tar.TypeDir && h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeSymlink,
			strings.HasPrefix(path.Base(rel), ".wh."):
			return nil, 0, fmt.Errorf("%s/%s (type %q) cannot be served from a volume: a tree holds directories, files and symbolic links", dir, rel, h.Typeflag)
		}
		if h.Typeflag == tar.TypeSymlink && !path.IsAbs(h.Linkname) {
			if to := path.Join(path.Dir(rel), h.Linkname); to == ".." || strings.HasPrefix(to, "../") {
				return nil, 0, fmt.Errorf("%s/%s links to %s, outside the tree: a volume cannot hold it", dir, rel, h.Linkname)
			}
		}
		if _, dup := sums[rel]; dup {
			return nil, 0, fmt.Errorf("%s/%s is in the layer twice", dir, rel)
		}
		sum, err := entrySum(h, tr)
		if err != nil {
			return nil, 0, fmt.Errorf("layer: %w", err)
		}
		sum.uid, sum.gid = h.Uid, h.Gid
		sums[rel] = sum
		size += sum.size
	}
	if _, ok := sums[rootKey]; !ok {
		return nil, 0, fmt.Errorf("%s is not a directory of the image", dir)
	}
	// Each entry's directory is a directory entry of the layer: not a
	// link (what is below one would be written elsewhere), nor missing
	// (the engine would make it with a mode of its own).
	for rel := range sums {
		if parent := path.Dir(rel); rel != rootKey && parent != "." {
			if p, ok := sums[parent]; !ok || !p.dir {
				return nil, 0, fmt.Errorf("%s/%s is below %s/%s, which is not a directory entry of the layer", dir, rel, dir, parent)
			}
		}
	}
	return sums, size, nil
}

// treeTar streams the tree of the layer at dir as a tar of paths relative
// to it, owners, modes and times kept; the root itself is not in it (the
// volume's root is set after, as for every cache volume).
func (s *savedImage) treeTar(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(func() error {
			tr := tar.NewReader(io.NewSectionReader(s.layer, 0, s.layer.Size()))
			tw := tar.NewWriter(pw)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					return tw.Close()
				}
				if err != nil {
					return err
				}
				rel, ok := inTree(h, dir)
				if !ok || rel == rootKey {
					continue
				}
				out := &tar.Header{
					Name: rel, Typeflag: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid,
					Size: h.Size, ModTime: h.ModTime, Linkname: h.Linkname, Format: tar.FormatPAX,
				}
				if h.Typeflag == tar.TypeDir {
					out.Name += "/"
				}
				if err := tw.WriteHeader(out); err != nil {
					return err
				}
				if h.Typeflag == tar.TypeReg {
					if _, err := io.Copy(tw, tr); err != nil {
						return err
					}
				}
			}
		}())
	}()
	return pr
}
