package containerdengine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/client"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/sandbox"
)

// imageInfo is what a container of an image needs.
type imageInfo struct {
	id      string   // the image ID: the digest of its config
	env     []string // the config's environment
	chainID string   // the unpacked image's top snapshot
}

// importer makes images available in the engine's namespace, by ID.
type importer struct {
	e     *Engine
	mu    sync.Mutex
	locks map[string]*sync.Mutex
	known map[string]imageInfo
}

func newImporter(e *Engine) *importer {
	return &importer{e: e, locks: map[string]*sync.Mutex{}, known: map[string]imageInfo{}}
}

// imageName is the name an image is kept under in the namespace: its ID.
func imageName(id string) string { return "sandboxd.local/image:" + strings.TrimPrefix(id, "sha256:") }

// ImageInspect returns the image of that ID, importing it from Docker (by
// ID: `docker save`, never a pull) if it is not yet in the namespace. An
// image whose config does not hash to its ID is never used.
func (e *Engine) ImageInspect(ctx context.Context, id string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	info, err := e.imports.ensure(e.ns(ctx), id)
	if err != nil {
		return client.ImageInspectResult{}, err
	}
	cfg := &dockerspec.DockerOCIImageConfig{}
	cfg.Env = info.env
	return client.ImageInspectResult{InspectResponse: image.InspectResponse{ID: info.id, Config: cfg}}, nil
}

func (im *importer) ensure(ctx context.Context, id string) (imageInfo, error) {
	if !sandbox.ValidDigest(id) {
		return imageInfo{}, fmt.Errorf("image %q: %w", id, errdefs.ErrInvalidArgument)
	}
	im.mu.Lock()
	l := im.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		im.locks[id] = l
	}
	im.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	im.mu.Lock()
	info, ok := im.known[id]
	im.mu.Unlock()
	if ok {
		// Still there? (someone may have removed it)
		if _, err := im.e.c.SnapshotService(im.e.cfg.Snapshotter).Stat(ctx, info.chainID); err == nil {
			return info, nil
		}
	}
	img, err := im.e.c.GetImage(ctx, imageName(id))
	if err == nil && !ok {
		if info, ok := im.recall(id, img.Target().Digest.String()); ok {
			if _, err := im.e.c.SnapshotService(im.e.cfg.Snapshotter).Stat(ctx, info.chainID); err == nil {
				im.mu.Lock()
				im.known[id] = info
				im.mu.Unlock()
				return info, nil
			}
		}
	}
	if errdefs.IsNotFound(err) {
		os.Remove(im.memoPath(id)) // the image is gone from the namespace
		img, err = im.fromDocker(ctx, id)
	}
	if err != nil {
		return imageInfo{}, err
	}
	info, config, err := im.prepare(ctx, img, id)
	if err != nil {
		return imageInfo{}, err
	}
	im.remember(id, img.Target().Digest.String(), config)
	im.mu.Lock()
	im.known[id] = info
	im.mu.Unlock()
	return info, nil
}

// The configs of the images this engine has read, by ID, are kept under
// StateDir/images, so that a one-shot process (sandboxd exec, run) reads
// an image's index, manifest and config from containerd once per
// machine, not once per process (4 to 8 ms of every cold exec; what is
// left is the image's record and its snapshot, one round trip each). A
// memo is the config's own bytes and the digest of the manifest (or
// index) the image's record named when it was read: it is used only if
// the bytes hash to the ID it is kept under (an image's ID is its
// config's digest), while the record names that same manifest and the
// image's snapshot is there. So a memo can name no other image than its
// own, nor outlive its record: a record removed (ctr images rm) makes
// the next process look for the image as before, and the memo goes.

// maxMemo bounds a memo, written or read.
const maxMemo = 1 << 20

func (im *importer) memoPath(id string) string {
	return filepath.Join(im.e.cfg.StateDir, "images", strings.TrimPrefix(id, "sha256:"))
}

// recall is the image of that ID as its memo has it, if it has a memo
// taken of the record whose target is target, whose bytes are that
// image's config.
func (im *importer) recall(id, target string) (imageInfo, bool) {
	f, err := os.OpenFile(im.memoPath(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return imageInfo{}, false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return imageInfo{}, false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxMemo+1))
	if err != nil || len(b) > maxMemo {
		return imageInfo{}, false
	}
	line, config, ok := bytes.Cut(b, []byte("\n"))
	if !ok || string(line) != "target "+target {
		return imageInfo{}, false
	}
	if sum := sha256.Sum256(config); "sha256:"+hex.EncodeToString(sum[:]) != id {
		return imageInfo{}, false
	}
	info, err := configInfo(id, config)
	return info, err == nil
}

// remember keeps an image's config (checked against its ID) and the
// target of the record it was read through as its memo, in one rename. A
// memo that cannot be written is not kept: the next process reads the
// image from containerd again.
func (im *importer) remember(id, target string, config []byte) {
	memo := append([]byte("target "+target+"\n"), config...)
	if len(memo) > maxMemo {
		return
	}
	dir := filepath.Dir(im.memoPath(id))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return
	}
	pruneMemoTemps(dir, time.Hour)
	f, err := os.CreateTemp(dir, ".memo-*")
	if err != nil {
		return
	}
	_, err = f.Write(memo)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), im.memoPath(id))
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

// pruneMemoTemps removes the temporary files of memos in dir older than
// age: what a process killed between a memo's write and its rename left.
func pruneMemoTemps(dir string, age time.Duration) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, ent := range ents {
		if !strings.HasPrefix(ent.Name(), ".memo-") {
			continue
		}
		if info, err := ent.Info(); err == nil && info.Mode().IsRegular() && time.Since(info.ModTime()) > age {
			os.Remove(filepath.Join(dir, ent.Name()))
		}
	}
}

// configInfo is what a container needs of the image whose config (the
// bytes whose digest is id) is config.
func configInfo(id string, config []byte) (imageInfo, error) {
	var oc ocispec.Image
	if err := json.Unmarshal(config, &oc); err != nil {
		return imageInfo{}, fmt.Errorf("image %s: parse config: %w", id, err)
	}
	return imageInfo{id: id, env: oc.Config.Env, chainID: identity.ChainID(oc.RootFS.DiffIDs).String()}, nil
}

// fromDocker imports one image from the Docker engine by ID.
func (im *importer) fromDocker(ctx context.Context, id string) (containerd.Image, error) {
	d := im.e.cfg.Docker
	if d == nil {
		return nil, fmt.Errorf("image %s: %w in containerd namespace %s (and no Docker engine to import it from)", id, errdefs.ErrNotFound, im.e.cfg.Namespace)
	}
	insp, err := d.ImageInspect(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", id, err) // NotFound stays NotFound
	}
	if insp.ID != id {
		return nil, fmt.Errorf("image %s: %w: docker resolved it to %s", id, errdefs.ErrNotFound, insp.ID)
	}
	rc, err := d.ImageSave(ctx, []string{id})
	if err != nil {
		return nil, fmt.Errorf("image %s: docker save: %w", id, err)
	}
	defer rc.Close()
	return im.importArchive(ctx, rc, id)
}

// importArchive imports a `docker save` or OCI archive holding the image
// id, under its ID name, and unpacks it.
func (im *importer) importArchive(ctx context.Context, r io.Reader, id string) (containerd.Image, error) {
	name := imageName(id)
	imgs, err := im.e.c.Import(ctx, r, containerd.WithIndexName(name), containerd.WithSkipDigestRef(func(string) bool { return true }))
	if err != nil {
		return nil, fmt.Errorf("image %s: import: %w", id, err)
	}
	_ = imgs
	img, err := im.e.c.GetImage(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("image %s: after import: %w", id, err)
	}
	return img, nil
}

// prepare checks that the image's config is the ID and unpacks it, and
// returns the config's bytes too. It walks the image's index and manifest
// once (the client's Config, RootFS and IsUnpacked walk them each, about
// twenty round trips in all).
func (im *importer) prepare(ctx context.Context, img containerd.Image, id string) (imageInfo, []byte, error) {
	cs := img.ContentStore()
	manifest, err := images.Manifest(ctx, cs, img.Target(), platforms.Default())
	if err != nil {
		return imageInfo{}, nil, fmt.Errorf("image %s: manifest: %w", id, err)
	}
	desc := manifest.Config
	if desc.Digest.String() != id {
		im.e.c.ImageService().Delete(ctx, img.Name())
		return imageInfo{}, nil, fmt.Errorf("image %s: %w: the imported image's config is %s", id, errdefs.ErrNotFound, desc.Digest)
	}
	blob, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return imageInfo{}, nil, fmt.Errorf("image %s: read config: %w", id, err)
	}
	info, err := configInfo(id, blob)
	if err != nil {
		return imageInfo{}, nil, err
	}
	sn := im.e.cfg.Snapshotter
	if _, err := im.e.c.SnapshotService(sn).Stat(ctx, info.chainID); err != nil {
		if err := img.Unpack(ctx, sn); err != nil {
			return imageInfo{}, nil, fmt.Errorf("image %s: unpack: %w", id, err)
		}
	}
	return info, blob, nil
}

// rootfsView names the shared view of an image for a set of mount points
// and a resolver address, with what its layer holds: the mount points,
// sorted once each, and the resolv.conf ("" for none).
func rootfsView(imageID string, targets []string, resolver string) (key string, dirs []string, resolv string) {
	dirs = slices.Clone(targets)
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	if resolver != "" {
		resolv = "nameserver " + resolver + "\n"
	}
	h := sha256.Sum256([]byte(strings.Join(dirs, "\n") + "\x00" + resolv))
	id := strings.TrimPrefix(imageID, "sha256:")
	id = id[:min(len(id), 32)]
	return "sandboxd-rootfs-" + id + "-" + hex.EncodeToString(h[:16]), dirs, resolv
}

// rootfsFor returns the read-only view jobs of the image share for a set
// of mount points: the image with those directories made (root-owned,
// 0755) in one committed layer on top, as Docker's init layer makes them
// (runc cannot create a mount point in a read-only root). With a resolver
// address, the layer's /etc/resolv.conf names only it, as Docker's
// --dns writes it, but as a file of the layer, not a mount of a host file.
func (im *importer) rootfsFor(ctx context.Context, info imageInfo, targets []string, resolver string) (string, error) {
	key, targets, resolv := rootfsView(info.id, targets, resolver)
	im.mu.Lock()
	l := im.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		im.locks[key] = l
	}
	im.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	sn := im.e.c.SnapshotService(im.e.cfg.Snapshotter)
	if _, err := sn.Stat(ctx, key); err == nil {
		return key, nil
	}
	labels := map[string]string{"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339)}
	layer := key + "-layer"
	if _, err := sn.Stat(ctx, layer); err != nil {
		var rnd [8]byte
		rand.Read(rnd[:])
		work := key + "-prepare-" + hex.EncodeToString(rnd[:])
		mounts, err := sn.Prepare(ctx, work, info.chainID, snapshots.WithLabels(labels))
		if err != nil {
			return "", fmt.Errorf("image %s: mount points: %w", info.id, err)
		}
		err = mount.WithTempMount(ctx, mounts, func(root string) error {
			r, err := os.OpenRoot(root)
			if err != nil {
				return err
			}
			defer r.Close()
			for _, t := range targets {
				rel := strings.TrimPrefix(t, "/")
				if st, err := r.Lstat(rel); err == nil {
					if !st.IsDir() {
						return fmt.Errorf("mount point %s is not a directory in the image", t)
					}
					continue
				}
				if err := r.MkdirAll(rel, 0o755); err != nil {
					return fmt.Errorf("mount point %s: %w", t, err)
				}
			}
			if resolv != "" {
				if err := r.MkdirAll("etc", 0o755); err != nil {
					return err
				}
				if st, err := r.Lstat("etc/resolv.conf"); err == nil && !st.Mode().IsRegular() {
					if err := r.Remove("etc/resolv.conf"); err != nil {
						return err
					}
				}
				if err := r.WriteFile("etc/resolv.conf", []byte(resolv), 0o644); err != nil {
					return fmt.Errorf("resolv.conf: %w", err)
				}
			}
			return nil
		})
		if err == nil {
			err = sn.Commit(ctx, layer, work, snapshots.WithLabels(labels))
		}
		if err != nil {
			sn.Remove(ctx, work)
			if !errdefs.IsAlreadyExists(err) {
				return "", fmt.Errorf("image %s: mount points: %w", info.id, err)
			}
		}
	}
	if _, err := sn.View(ctx, key, layer, snapshots.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		return "", fmt.Errorf("image %s: root filesystem view: %w", info.id, err)
	}
	return key, nil
}
