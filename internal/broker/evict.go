package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// inputDigests are the blobs a job reads.
func inputDigests(j *sandbox.Job) []string {
	ds := make([]string, 0, len(j.Inputs))
	for _, in := range j.Inputs {
		ds = append(ds, in.Digest)
	}
	return ds
}

// InputVolume is a cache volume holding a read-only input, or a tree of
// an image (trees.go).
type InputVolume struct {
	Name string
	// Digest is the input's, or the image ID of a tree.
	Digest string
	// Tree is the directory of the image a tree's volume holds, or "".
	Tree string
	// Size is the input's size (its tar's), or 0 if the blob is gone and
	// the volume does not say.
	Size int64
	// Used is when a job last used it (its check record's time), or when
	// it was created.
	Used time.Time
}

// InputVolumes lists this broker's read-only input volumes and image
// tree volumes.
func (b *Broker) InputVolumes(ctx context.Context) ([]InputVolume, error) {
	var vs []volume.Volume
	for _, role := range []string{roleInput, roleTree} {
		f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+role)
		got, err := b.eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
		if err != nil {
			return nil, fmt.Errorf("list %s volumes: %w", role, err)
		}
		vs = append(vs, got.Items...)
	}
	out := make([]InputVolume, 0, len(vs))
	for _, v := range vs {
		iv := InputVolume{Name: v.Name, Digest: v.Labels[LabelDigest]}
		if v.Labels[LabelRole] == roleTree {
			iv.Tree = v.Labels[LabelTree]
		}
		if n, err := strconv.ParseInt(v.Labels[LabelSize], 10, 64); err == nil {
			iv.Size = n
		} else if n, err := b.blobs.Size(iv.Digest); err == nil {
			iv.Size = n
		}
		var created time.Time
		if t, err := time.Parse(time.RFC3339, v.CreatedAt); err == nil {
			created = t
		}
		iv.Used = b.lastUsed(v.Name, created)
		out = append(out, iv)
	}
	return out, nil
}

// lastUsed is when a job last used the volume name as this process and
// the check records in CacheDir know it (other processes with this
// CacheDir touch its record on every use), or since, if later.
func (b *Broker) lastUsed(name string, since time.Time) time.Time {
	used := since
	if t := b.volumes.lastUsed(name); t.After(used) {
		used = t
	}
	if b.cfg.CacheDir != "" {
		if st, err := os.Stat(filepath.Join(b.cfg.CacheDir, name)); err == nil && st.ModTime().After(used) {
			used = st.ModTime()
		}
	}
	return used
}

// VolumeReport is what EvictInputVolumes removed and what is left.
type VolumeReport struct {
	Evicted      int   `json:"evicted_volumes"`
	EvictedBytes int64 `json:"evicted_bytes"`
	Volumes      int   `json:"volumes"`
	Bytes        int64 `json:"bytes"`
}

// EvictInputVolumes removes read-only input volumes and image tree
// volumes, least recently used first, while they hold more than budget
// bytes. A volume whose input a queued or running job needs (pinned in the
// blob store), an image's tree a running job of this process uses (pinned
// in the volume cache), and one a container mounts (the engine refuses)
// are never removed. A job whose volume was removed gets it populated
// again (from the blob store, or the image).
func (b *Broker) EvictInputVolumes(ctx context.Context, budget int64) (VolumeReport, error) {
	return b.CollectInputVolumes(ctx, VolumePolicy{Budget: budget})
}

// VolumePolicy says what CollectInputVolumes may remove.
type VolumePolicy struct {
	// Budget is the most bytes the volumes may hold: beyond it the least
	// recently used go.
	Budget int64
	// MinAge spares every volume used more recently, as this process and
	// the check records in CacheDir know it.
	MinAge time.Duration
	// Shared says that brokers of this name with other blob stores use the
	// volumes too (one-shot processes on other states): a volume whose
	// blob this store lacks may serve one of them, and is no orphan.
	Shared bool
}

// CollectInputVolumes is EvictInputVolumes with a policy. What it never
// removes: a volume a job of this process needs (pinned), one used within
// MinAge, one a container mounts (the engine refuses, and then keeps it
// until that container is removed). A volume another process checked and
// is about to mount may go: that job stages it again (see execute).
func (b *Broker) CollectInputVolumes(ctx context.Context, p VolumePolicy) (VolumeReport, error) {
	vols, err := b.InputVolumes(ctx)
	if err != nil {
		return VolumeReport{}, err
	}
	budget := p.Budget
	var rep VolumeReport
	for _, v := range vols {
		rep.Volumes++
		rep.Bytes += v.Size
	}
	// A volume whose blob is gone serves no job of this store (each use
	// reads the blob to check the volume): it goes first, whatever the
	// budget, unless other stores share the volumes. So does a tree whose
	// image the engine no longer has.
	has := map[string]bool{} // by volume name
	for _, v := range vols {
		switch {
		case v.Tree != "":
			_, err := b.eng.ImageInspect(ctx, v.Digest)
			has[v.Name] = !errdefs.IsNotFound(err)
		default:
			has[v.Name] = p.Shared || b.blobs.Has(v.Digest)
		}
	}
	slices.SortFunc(vols, func(x, y InputVolume) int {
		if has[x.Name] != has[y.Name] {
			if has[y.Name] {
				return -1
			}
			return 1
		}
		return x.Used.Compare(y.Used)
	})
	var errs []error
	for _, v := range vols {
		if rep.Bytes <= budget && has[v.Name] {
			break
		}
		switch gone, err := b.evictVolume(ctx, v, p.MinAge); {
		case err != nil:
			errs = append(errs, err)
		case gone:
			rep.Evicted++
			rep.EvictedBytes += v.Size
			rep.Volumes--
			rep.Bytes -= v.Size
		}
	}
	return rep, errors.Join(errs...)
}

// evictVolume removes one input volume unless a job needs it or used it
// within minAge, holding the volume's lock so that no job of this process
// checks it meanwhile.
func (b *Broker) evictVolume(ctx context.Context, v InputVolume, minAge time.Duration) (bool, error) {
	unlock := b.volumes.lock(v.Name)
	defer unlock()
	if b.blobs.Pinned(v.Digest) || b.volumes.pinned(v.Name) {
		return false, nil
	}
	if minAge > 0 && time.Since(b.lastUsed(v.Name, v.Used)) < minAge {
		return false, nil
	}
	if _, err := b.eng.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{}); err != nil {
		if isNotFound(err) {
			return false, nil
		}
		if errdefs.IsConflict(err) {
			return false, nil // a container mounts it
		}
		return false, fmt.Errorf("remove volume %s: %w", v.Name, err)
	}
	b.volumes.forget(v.Name)
	b.log.Info("evicted a cache volume", "volume", v.Name, "bytes", v.Size, "tree", v.Tree)
	return true, nil
}

// CachePolicy bounds the caches of a one-shot broker (`sandboxd run`,
// `sandboxd exec`).
type CachePolicy struct {
	// VolumeBudget is the most bytes of read-only input volumes of this
	// broker's name kept (every state's: they share the volumes).
	VolumeBudget int64
	// MinAge spares every blob and volume used more recently.
	MinAge time.Duration
}

// DefaultCachePolicy is the daemon's budget for input volumes and its
// floor: 10 GiB, nothing used in the last 10 minutes.
func DefaultCachePolicy() CachePolicy {
	return CachePolicy{VolumeBudget: 10 << 30, MinAge: 10 * time.Minute}
}

// Validate reports a policy that would remove everything or nothing.
func (p CachePolicy) Validate() error {
	if p.VolumeBudget < 0 || p.MinAge <= 0 {
		return fmt.Errorf("cache policy: VolumeBudget %d must not be negative, MinAge %v must be positive", p.VolumeBudget, p.MinAge)
	}
	return nil
}

// CacheReport is what CollectCaches removed and what is left.
type CacheReport struct {
	Blobs   store.SweepReport `json:"blobs"`
	Volumes VolumeReport      `json:"volumes"`
}

// CollectCaches collects the caches of a one-shot broker, whose blob store
// is its state's, shared by the one-shot processes running on it
// (store.Share), and whose input volumes are shared by every one-shot
// process of its name on this engine, whatever its state.
//
// Nothing durable names a one-shot state's blobs (what a run keeps is in
// its evidence directory, written before this runs): every blob is an
// orphan and goes, unless a job of this process needs it, or a process
// sharing the store used it since it began, or it was used within
// p.MinAge. Input volumes go least recently used first beyond
// p.VolumeBudget, never one used within p.MinAge or one a container
// mounts (see CollectInputVolumes).
func (b *Broker) CollectCaches(ctx context.Context, p CachePolicy) (CacheReport, error) {
	if err := p.Validate(); err != nil {
		return CacheReport{}, err
	}
	var rep CacheReport
	var errs []error
	var err error
	rep.Blobs, err = b.blobs.Sweep(store.SweepPolicy{Referenced: func(string) bool { return false }, MinAge: p.MinAge})
	if err != nil {
		errs = append(errs, fmt.Errorf("collect blobs: %w", err))
	}
	rep.Volumes, err = b.CollectInputVolumes(ctx, VolumePolicy{Budget: p.VolumeBudget, MinAge: p.MinAge, Shared: true})
	if err != nil {
		errs = append(errs, fmt.Errorf("collect input volumes: %w", err))
	}
	if n := rep.Blobs.Removed + rep.Blobs.Evicted; n > 0 || rep.Volumes.Evicted > 0 {
		b.log.Info("caches collected", "blobs_removed", n, "blob_bytes_freed", rep.Blobs.RemovedBytes+rep.Blobs.EvictedBytes,
			"volumes_evicted", rep.Volumes.Evicted, "volume_bytes_freed", rep.Volumes.EvictedBytes)
	}
	return rep, errors.Join(errs...)
}
