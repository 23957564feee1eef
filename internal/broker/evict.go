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
	"github.com/moby/moby/client"

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

// InputVolume is a cache volume holding a read-only input.
type InputVolume struct {
	Name   string
	Digest string
	// Size is the input's size (its tar's), or 0 if the blob is gone and
	// the volume does not say.
	Size int64
	// Used is when a job last used it (its check record's time), or when
	// it was created.
	Used time.Time
}

// InputVolumes lists this broker's read-only input volumes.
func (b *Broker) InputVolumes(ctx context.Context) ([]InputVolume, error) {
	f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+roleInput)
	vs, err := b.eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list input volumes: %w", err)
	}
	out := make([]InputVolume, 0, len(vs.Items))
	for _, v := range vs.Items {
		iv := InputVolume{Name: v.Name, Digest: v.Labels[LabelDigest]}
		if n, err := strconv.ParseInt(v.Labels[LabelSize], 10, 64); err == nil {
			iv.Size = n
		} else if n, err := b.blobs.Size(iv.Digest); err == nil {
			iv.Size = n
		}
		if t, err := time.Parse(time.RFC3339, v.CreatedAt); err == nil {
			iv.Used = t
		}
		if t := b.volumes.lastUsed(v.Name); t.After(iv.Used) {
			iv.Used = t
		}
		if b.cfg.CacheDir != "" {
			if st, err := os.Stat(filepath.Join(b.cfg.CacheDir, v.Name)); err == nil && st.ModTime().After(iv.Used) {
				iv.Used = st.ModTime()
			}
		}
		out = append(out, iv)
	}
	return out, nil
}

// VolumeReport is what EvictInputVolumes removed and what is left.
type VolumeReport struct {
	Evicted      int   `json:"evicted_volumes"`
	EvictedBytes int64 `json:"evicted_bytes"`
	Volumes      int   `json:"volumes"`
	Bytes        int64 `json:"bytes"`
}

// EvictInputVolumes removes read-only input volumes, least recently used
// first, while they hold more than budget bytes. A volume whose input a
// queued or running job needs (pinned in the blob store) is never
// removed, nor one a container mounts (the engine refuses). A job whose
// input volume was removed gets it populated again from the blob store.
func (b *Broker) EvictInputVolumes(ctx context.Context, budget int64) (VolumeReport, error) {
	vols, err := b.InputVolumes(ctx)
	if err != nil {
		return VolumeReport{}, err
	}
	var rep VolumeReport
	for _, v := range vols {
		rep.Volumes++
		rep.Bytes += v.Size
	}
	// A volume whose blob is gone serves no job (each use reads the blob
	// to check the volume): it goes first, whatever the budget.
	has := map[string]bool{}
	for _, v := range vols {
		has[v.Digest] = b.blobs.Has(v.Digest)
	}
	slices.SortFunc(vols, func(x, y InputVolume) int {
		if has[x.Digest] != has[y.Digest] {
			if has[y.Digest] {
				return -1
			}
			return 1
		}
		return x.Used.Compare(y.Used)
	})
	var errs []error
	for _, v := range vols {
		if rep.Bytes <= budget && has[v.Digest] {
			break
		}
		switch gone, err := b.evictVolume(ctx, v); {
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

// evictVolume removes one input volume unless a job needs it, holding the
// volume's lock so that no job checks it meanwhile.
func (b *Broker) evictVolume(ctx context.Context, v InputVolume) (bool, error) {
	unlock := b.volumes.lock(v.Name)
	defer unlock()
	if b.blobs.Pinned(v.Digest) {
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
	b.log.Info("evicted an input volume", "volume", v.Name, "bytes", v.Size)
	return true, nil
}
