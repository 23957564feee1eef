package broker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
)

// fileSum is what the cache check compares for each entry of a volume.
type fileSum struct {
	dir    bool
	mode   int64
	size   int64
	digest string
	// The owner: the root's group always, every entry's uid and gid in a
	// listing with owners (an image's tree keeps the image's owners).
	uid, gid int
}

// String says what an entry is, for an error naming a difference.
func (f fileSum) String() string {
	owner := fmt.Sprintf("%d:%d", f.uid, f.gid)
	switch {
	case f.dir:
		return fmt.Sprintf("directory %04o %s", f.mode, owner)
	case f.mode < 0:
		return f.digest
	default:
		return fmt.Sprintf("file %04o %s, %d bytes, sha256 %s", f.mode, owner, f.size, f.digest)
	}
}

// rootKey holds the volume's root directory in a tree listing.
const rootKey = "."

// volumeRoot is the root entry a cache volume must have: mode and group.
// Read-only inputs (the bundle, a candidate's export) are 0750 and owned
// by the candidate's group, so the uid a grader runs as can read them and
// the code uid of the exec service cannot: a program graded out of
// process never sees the hidden tests or the expected answers.
func volumeRoot(mode int64, gid int) fileSum { return fileSum{dir: true, mode: mode, gid: gid} }

// treeSums lists the entries of a tar by path, hashing file contents. strip
// removes a leading path component (the archive API prefixes the source
// directory's name). owners records every entry's uid and gid too.
func treeSums(r io.Reader, strip string, owners bool) (map[string]fileSum, error) {
	out := map[string]fileSum{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		if strip != "" {
			if name == strip {
				if h.Typeflag == tar.TypeDir {
					root := fileSum{dir: true, mode: h.Mode & 0o7777, gid: h.Gid}
					if owners {
						root.uid = h.Uid
					}
					out[rootKey] = root
				}
				continue
			}
			rest, ok := strings.CutPrefix(name, strip+"/")
			if !ok {
				return nil, fmt.Errorf("unexpected entry %q", h.Name)
			}
			name = rest
		}
		if name == "" || name == "." {
			continue
		}
		sum, err := entrySum(h, tr)
		if err != nil {
			return nil, err
		}
		if owners {
			sum.uid, sum.gid = h.Uid, h.Gid
		}
		out[name] = sum
	}
}

// entrySum is what a check compares of one tar entry, its content read
// from r: a directory's mode, a file's mode, size and digest, a symbolic
// link's target. Any other entry is listed as its type, which no expected
// tree holds (a volume holds directories, regular files and, an image's
// tree, the links of the image), so it fails the check.
func entrySum(h *tar.Header, r io.Reader) (fileSum, error) {
	switch h.Typeflag {
	case tar.TypeDir:
		return fileSum{dir: true, mode: h.Mode & 0o7777}, nil
	case tar.TypeReg:
		hh := sha256.New()
		n, err := io.Copy(hh, r)
		if err != nil {
			return fileSum{}, err
		}
		return fileSum{mode: h.Mode & 0o7777, size: n, digest: hex.EncodeToString(hh.Sum(nil))}, nil
	case tar.TypeSymlink:
		return fileSum{mode: -1, digest: "symlink " + h.Linkname}, nil
	default:
		return fileSum{mode: -1, digest: "type " + string(h.Typeflag)}, nil
	}
}

// volumeCache populates read-only volumes once per content digest and
// checks them, by content, before their first use in this process.
type volumeCache struct {
	b        *Broker
	mu       sync.Mutex
	locks    map[string]*sync.Mutex
	verified map[string]string // volume name → the record of the volume checked
	used     map[string]time.Time
	pins     map[string]int // volumes a job of this process is about to mount or mounts
}

func newVolumeCache(b *Broker) *volumeCache {
	return &volumeCache{b: b, locks: map[string]*sync.Mutex{}, verified: map[string]string{}, used: map[string]time.Time{}, pins: map[string]int{}}
}

// pin keeps eviction from the volumes until the returned func is called.
func (c *volumeCache) pin(names ...string) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		c.pins[n]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, n := range names {
				if c.pins[n]--; c.pins[n] <= 0 {
					delete(c.pins, n)
				}
			}
		})
	}
}

func (c *volumeCache) pinned(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pins[name] > 0
}

func (c *volumeCache) lock(name string) func() {
	c.mu.Lock()
	l, ok := c.locks[name]
	if !ok {
		l = &sync.Mutex{}
		c.locks[name] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// ErrCacheCheck marks a cached volume whose content differs from its digest.
var ErrCacheCheck = errors.New("volume content check failed")

// volumeSource is what a cache volume must hold.
type volumeSource struct {
	// labels are the volume's, set when it is created.
	labels map[string]string
	// sums list the tree (treeSums of the tar open returns), and owners
	// says whether they hold every entry's owner.
	sums   map[string]fileSum
	owners bool
	// open returns the tree as a tar, extracted into the volume's root.
	open func() (io.ReadCloser, error)
	// settle is how long a volume another process created, and is
	// perhaps filling, is waited for (looked at again every settleEvery)
	// while a populate container of this broker's name exists, before it
	// is judged (0: settleTime, settleWait).
	settle, settleEvery time.Duration
}

// sumsKey is the key of a check against sums: their digest.
func sumsKey(sums map[string]fileSum) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		f := sums[k]
		fmt.Fprintf(h, "%q %v %o %d %s %d %d\n", k, f.dir, f.mode, f.size, f.digest, f.uid, f.gid)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ensure makes volume name hold exactly the tree load returns. key names
// that tree (a check record holds it): the digest of its sums, or of
// what pins them. load is called only when the volume must be read back
// (or filled); image is any local image to base the never-started helper
// container on.
func (c *volumeCache) ensure(ctx context.Context, name, image, key string, load func() (volumeSource, error)) (bool, error) {
	unlock := c.lock(name)
	defer unlock()
	defer c.markUsed(name)
	record := c.recordOf(ctx, name, key)
	c.mu.Lock()
	known := c.verified[name]
	c.mu.Unlock()
	if known != "" && known == record {
		return false, nil // checked before, and it is still the same volume
	}
	if record != "" && c.b.cfg.CacheDir != "" {
		if b, err := os.ReadFile(filepath.Join(c.b.cfg.CacheDir, name)); err == nil && string(b) == record {
			c.mu.Lock()
			c.verified[name] = record
			c.mu.Unlock()
			return false, nil
		}
	}
	src, err := load()
	if err != nil {
		return false, err
	}
	expected := src.sums
	settle, every := src.settle, src.settleEvery
	if settle == 0 {
		settle, every = settleTime, settleWait
	}
	populated, rebuilt := false, false
	for attempt := 0; ; attempt++ {
		var checked string // the record of the volume the helper mounted
		got, err := c.withHelper(ctx, name, image, src.labels, func(id, nonce string) (map[string]fileSum, error) {
			// The helper container mounts the volume now: the engine
			// removes it for no one until the container is gone, so the
			// nonce read here is the nonce of what is read and filled.
			checked = c.recordOf(ctx, name, key)
			if checked == "" {
				return nil, errNoNonce
			}
			created := strings.HasPrefix(checked, nonce+" ")
			sums, err := c.read(ctx, id, src.owners)
			if err != nil {
				return nil, err
			}
			_, root := sums[rootKey]
			switch empty := len(sums) == 0 || (root && len(sums) == 1); {
			case created && empty:
				// Fresh, and this call's: populate it, then read it back.
			case created || maps.Equal(sums, expected):
				return sums, nil
			default:
				// Another process's volume, not as expected (yet): it may
				// be filling it right now. Only the process that created a
				// volume fills it; this one waits for its populate
				// containers, then reads the volume again, whole.
				if err := c.awaitOthers(ctx, name, id, settle, every); err != nil {
					return nil, err
				}
				return c.read(ctx, id, src.owners)
			}
			rc, err := src.open()
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			if _, err := c.b.eng.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: "/v", Content: rc, CopyUIDGID: src.owners}); err != nil {
				return nil, fmt.Errorf("populate volume %s: %w", name, err)
			}
			// Then the root's mode and owner, as listed in expected.
			if root, ok := expected[rootKey]; ok {
				var buf bytes.Buffer
				tw := tar.NewWriter(&buf)
				tw.WriteHeader(&tar.Header{Name: "v/", Typeflag: tar.TypeDir, Mode: root.mode, Uid: root.uid, Gid: root.gid})
				tw.Close()
				if _, err := c.b.eng.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: "/", Content: &buf, CopyUIDGID: true}); err != nil {
					return nil, fmt.Errorf("set the root of volume %s: %w", name, err)
				}
			}
			populated = true
			return c.read(ctx, id, src.owners)
		})
		if errors.Is(err, errNoNonce) && attempt == 0 {
			// A volume without a nonce was not made by withHelper: the
			// engine makes one, empty, when a container names a volume
			// removed meanwhile. Nothing binds its content to a check, so
			// it is rebuilt (once), never trusted.
			c.b.log.Warn("cached volume has no nonce of this broker; rebuilding", "volume", name)
			if _, err := c.b.eng.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil {
				return populated, fmt.Errorf("volume %s has no nonce and cannot be removed: %w", name, err)
			}
			continue
		}
		if errors.Is(err, errNoNonce) {
			return populated, fmt.Errorf("volume %s, created again: %w", name, err)
		}
		if err != nil {
			return populated, err
		}
		if maps.Equal(got, expected) {
			// Trust only the volume that was read back: if it was replaced
			// meanwhile, its nonce differs and nothing is trusted.
			if c.recordOf(ctx, name, key) != checked {
				return populated, fmt.Errorf("volume %s: %w: it changed while it was checked", name, ErrCacheCheck)
			}
			c.mu.Lock()
			c.verified[name] = checked
			c.mu.Unlock()
			c.remember(name, checked)
			return populated, nil
		}
		if rebuilt || attempt > 0 {
			return populated, fmt.Errorf("volume %s: %w (%s)", name, ErrCacheCheck, firstDifference(got, expected))
		}
		// A cache entry that fails its check is rebuilt, never used.
		c.b.log.Warn("cached volume failed its content check; rebuilding", "volume", name, "difference", firstDifference(got, expected))
		if _, err := c.b.eng.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil {
			return populated, fmt.Errorf("volume %s failed its check (%s) and cannot be removed: %w", name, firstDifference(got, expected), err)
		}
		rebuilt = true
	}
}

// A volume another process created is waited for while that process's
// populate containers of it exist, looked for settleWait apart, for
// settleTime at most (or its source's settle), before it is judged.
const (
	settleTime = 5 * time.Second
	settleWait = 250 * time.Millisecond
)

// errNoNonce marks a volume that carries no nonce of a broker.
var errNoNonce = errors.New("the volume has no nonce")

// firstDifference names the first path (in order) whose entry differs
// between a volume as read and as expected.
func firstDifference(got, want map[string]fileSum) string {
	paths := maps.Clone(got)
	maps.Copy(paths, want)
	for _, k := range slices.Sorted(maps.Keys(paths)) {
		g, inGot := got[k]
		w, inWant := want[k]
		switch {
		case !inGot:
			return fmt.Sprintf("%s missing", k)
		case !inWant:
			return fmt.Sprintf("%s not expected", k)
		case g != w:
			return fmt.Sprintf("%s is %v, want %v", k, g, w)
		}
	}
	return "no difference"
}

// awaitOthers waits, for settle at most, until no populate container of
// this broker's name but own mounts volume vol: one that does may be
// filling it. A listing the engine refuses ends the wait with its error.
func (c *volumeCache) awaitOthers(ctx context.Context, vol, own string, settle, every time.Duration) error {
	f := make(client.Filters).Add("label", LabelBroker+"="+c.b.cfg.Name, LabelRole+"="+rolePopulate, LabelVolume+"="+vol)
	for deadline := time.Now().Add(settle); ; {
		cs, err := c.b.eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			return fmt.Errorf("list populate containers: %w", err)
		}
		if !slices.ContainsFunc(cs.Items, func(x container.Summary) bool { return x.ID != own }) || time.Now().After(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, every); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *volumeCache) read(ctx context.Context, id string, owners bool) (map[string]fileSum, error) {
	c.b.stats.VolumesChecked.Add(1)
	res, err := c.b.eng.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: "/v"})
	if err != nil {
		return nil, fmt.Errorf("read back volume: %w", err)
	}
	defer res.Content.Close()
	return treeSums(res.Content, "v", owners)
}

// withHelper creates (never starts) a container with the volume mounted
// read-write at /v, runs fn, and removes the container.
// fn is given the container's ID and the nonce a volume this call
// created carries.
func (c *volumeCache) withHelper(ctx context.Context, vol, image string, labels map[string]string, fn func(id, nonce string) (map[string]fileSum, error)) (map[string]fileSum, error) {
	// Each volume gets a nonce when it is created (an existing volume keeps
	// its own): a record of a check names it, so a volume created anew under
	// the same name is never mistaken for the one that was checked.
	var nonce [16]byte
	rand.Read(nonce[:])
	withNonce := maps.Clone(labels)
	withNonce[LabelNonce] = hex.EncodeToString(nonce[:])
	if _, err := c.b.eng.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: withNonce}); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", vol, err)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	hl := map[string]string{LabelRole: rolePopulate, LabelBroker: c.b.cfg.Name, LabelVolume: vol}
	res, err := c.b.eng.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: "sandboxd-populate-" + hex.EncodeToString(rnd[:]),
		Config: &container.Config{
			Image:      image,
			Entrypoint: []string{"/nonexistent"}, // never started
			Labels:     hl,
		},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			Mounts: []mount.Mount{{
				Type: mount.TypeVolume, Source: vol, Target: "/v",
				VolumeOptions: &mount.VolumeOptions{NoCopy: true},
			}},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create populate container for %s: %w", vol, err)
	}
	defer c.b.removeContainer(res.ID)
	return fn(res.ID, withNonce[LabelNonce])
}

// isNotFound reports an engine "not found" error.
func isNotFound(err error) bool { return errdefs.IsNotFound(err) }

// recordOf names one check of a volume: the volume's nonce (a volume
// removed and created again under the same name is checked again) and the
// key of the tree it was checked against. "" if the volume cannot be
// inspected or has no nonce.
func (c *volumeCache) recordOf(ctx context.Context, name, key string) string {
	v, err := c.b.eng.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	if err != nil || v.Volume.Labels[LabelNonce] == "" {
		return ""
	}
	return v.Volume.Labels[LabelNonce] + " " + key + "\n"
}

// remember records a passed check in CacheDir, so that other processes of
// this broker (each `sandboxd run`) need not read the volume back again.
// The check guards against a population cut short; content changed in
// place by someone who controls the engine is outside what it can detect
// anyway.
func (c *volumeCache) remember(name, record string) {
	dir := c.b.cfg.CacheDir
	if dir == "" || record == "" || os.MkdirAll(dir, 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(dir, ".record-*")
	if err != nil {
		return
	}
	_, err = tmp.WriteString(record)
	if cerr := tmp.Close(); err == nil && cerr == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}

// errVolumeGone marks a checked volume that was removed before a container
// mounted it (another process's collection may remove an idle volume at
// any time): the job's inputs are staged again.
var errVolumeGone = errors.New("removed after it was checked")

// stillChecked reports an error unless the volume is the one that was
// checked: the engine creates an empty volume for a named mount whose
// volume was removed, and that one carries no nonce of ours.
func (c *volumeCache) stillChecked(ctx context.Context, name string) error {
	c.mu.Lock()
	rec := c.verified[name]
	c.mu.Unlock()
	nonce, _, _ := strings.Cut(rec, " ")
	v, err := c.b.eng.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	if isNotFound(err) && nonce != "" {
		return fmt.Errorf("volume %s: %w", name, errVolumeGone)
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	if nonce == "" {
		return fmt.Errorf("volume %s: %w: it was never checked", name, ErrCacheCheck)
	}
	if v.Volume.Labels[LabelNonce] != nonce {
		return fmt.Errorf("volume %s: %w: it is not the volume that was checked (%w)", name, ErrCacheCheck, errVolumeGone)
	}
	return nil
}

// markUsed records that a job used the volume now: eviction removes the
// least recently used first. The check record's time says it to other
// processes of this broker.
func (c *volumeCache) markUsed(name string) {
	now := time.Now()
	c.mu.Lock()
	c.used[name] = now
	c.mu.Unlock()
	if c.b.cfg.CacheDir != "" {
		os.Chtimes(filepath.Join(c.b.cfg.CacheDir, name), now, now)
	}
}

// lastUsed is when this process last used the volume, or zero.
func (c *volumeCache) lastUsed(name string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used[name]
}

// forget drops what is known of a removed volume: the next job that needs
// it creates, populates and checks it again.
func (c *volumeCache) forget(name string) {
	c.mu.Lock()
	delete(c.verified, name)
	delete(c.used, name)
	c.mu.Unlock()
	if c.b.cfg.CacheDir != "" {
		os.Remove(filepath.Join(c.b.cfg.CacheDir, name))
	}
}
