package containerdengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"
)

// Volumes are directories the engine owns under StateDir/volumes, each
// with its labels beside its data. A container mounts one by bind mount
// (read-only for the sandbox); nothing else of the host is ever mounted.

// volumeNameRE, at most 201 bytes: as a counted repetition ({0,200}) it
// compiled into 200 copies of its class, 2 ms of every process's start.
var volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func (e *Engine) volumeDir(name string) (string, error) {
	if len(name) > 201 || !volumeNameRE.MatchString(name) {
		return "", fmt.Errorf("volume name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(e.cfg.StateDir, "volumes", name), nil
}

// volumeData is the directory a container mounts.
func (e *Engine) volumeData(name string) (string, error) {
	d, err := e.volumeDir(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "_data"), nil
}

type volumeRecord struct {
	Labels    map[string]string `json:"labels"`
	CreatedAt time.Time         `json:"created_at"`
}

// VolumeCreate creates a volume, or returns the existing one of that name
// unchanged (as Docker's local driver does).
func (e *Engine) VolumeCreate(ctx context.Context, opts client.VolumeCreateOptions) (client.VolumeCreateResult, error) {
	dir, err := e.volumeDir(opts.Name)
	if err != nil {
		return client.VolumeCreateResult{}, err
	}
	if v, err := e.readVolume(opts.Name); err == nil {
		return client.VolumeCreateResult{Volume: v}, nil
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := dir + ".new-" + hex.EncodeToString(rnd[:])
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return client.VolumeCreateResult{}, fmt.Errorf("create volume %s: %w", opts.Name, err)
	}
	rec, _ := json.Marshal(volumeRecord{Labels: opts.Labels, CreatedAt: time.Now().UTC()})
	err = errors.Join(os.Mkdir(filepath.Join(tmp, "_data"), 0o755), os.WriteFile(filepath.Join(tmp, "labels.json"), rec, 0o600))
	if err == nil {
		err = os.Rename(tmp, dir) // fails if another process made it first
	}
	if err != nil {
		os.RemoveAll(tmp)
		if v, rerr := e.readVolume(opts.Name); rerr == nil {
			return client.VolumeCreateResult{Volume: v}, nil
		}
		return client.VolumeCreateResult{}, fmt.Errorf("create volume %s: %w", opts.Name, err)
	}
	v, err := e.readVolume(opts.Name)
	return client.VolumeCreateResult{Volume: v}, err
}

func (e *Engine) readVolume(name string) (volume.Volume, error) {
	dir, err := e.volumeDir(name)
	if err != nil {
		return volume.Volume{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "labels.json"))
	if errors.Is(err, os.ErrNotExist) {
		return volume.Volume{}, fmt.Errorf("volume %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return volume.Volume{}, err
	}
	var rec volumeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return volume.Volume{}, fmt.Errorf("volume %s: record: %w", name, err)
	}
	if rec.Labels == nil {
		rec.Labels = map[string]string{}
	}
	return volume.Volume{Name: name, Driver: "sandboxd-dir", Mountpoint: filepath.Join(dir, "_data"), Labels: rec.Labels,
		CreatedAt: rec.CreatedAt.Format(time.RFC3339), Scope: "local"}, nil
}

// VolumeInspect returns a volume.
func (e *Engine) VolumeInspect(ctx context.Context, name string, _ client.VolumeInspectOptions) (client.VolumeInspectResult, error) {
	v, err := e.readVolume(name)
	return client.VolumeInspectResult{Volume: v}, err
}

// VolumeRemove removes a volume no container mounts.
func (e *Engine) VolumeRemove(ctx context.Context, name string, opts client.VolumeRemoveOptions) (client.VolumeRemoveResult, error) {
	dir, err := e.volumeDir(name)
	if err != nil {
		return client.VolumeRemoveResult{}, err
	}
	// Exclusive: no container that mounts it is being created, in this
	// process or another, while its users are looked at and it goes.
	unlock, err := e.lockVolumes(unix.LOCK_EX)
	if err != nil {
		return client.VolumeRemoveResult{}, err
	}
	defer unlock()
	if _, err := e.readVolume(name); err != nil {
		if errdefs.IsNotFound(err) && opts.Force {
			return client.VolumeRemoveResult{}, nil
		}
		return client.VolumeRemoveResult{}, err
	}
	users, err := e.volumeUsers(ctx, name)
	if err != nil {
		return client.VolumeRemoveResult{}, err
	}
	if len(users) > 0 {
		return client.VolumeRemoveResult{}, fmt.Errorf("volume %s is in use by %v: %w", name, users, errdefs.ErrConflict)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	gone := dir + ".gone-" + hex.EncodeToString(rnd[:])
	if err := os.Rename(dir, gone); err != nil {
		return client.VolumeRemoveResult{}, fmt.Errorf("remove volume %s: %w", name, err)
	}
	return client.VolumeRemoveResult{}, os.RemoveAll(gone)
}

// lockVolumes takes the flock on StateDir/volumes.lock (shared or
// exclusive, how) that keeps a volume's removal apart from the creation of
// a container that mounts it, across every process on this state.
func (e *Engine) lockVolumes(how int) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(e.cfg.StateDir, "volumes.lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("volumes lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("volumes lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// VolumeList lists volumes whose labels match the filters' "label" terms.
func (e *Engine) VolumeList(ctx context.Context, opts client.VolumeListOptions) (client.VolumeListResult, error) {
	ents, err := os.ReadDir(filepath.Join(e.cfg.StateDir, "volumes"))
	if err != nil {
		return client.VolumeListResult{}, err
	}
	want := labelTerms(opts.Filters)
	var out client.VolumeListResult
	for _, ent := range ents {
		if strings.Contains(ent.Name(), ".new-") || strings.Contains(ent.Name(), ".gone-") {
			continue
		}
		v, err := e.readVolume(ent.Name())
		if err != nil {
			continue
		}
		if matchLabels(v.Labels, want) {
			out.Items = append(out.Items, v)
		}
	}
	return out, nil
}

// labelTerms returns the "label" filter terms: "k=v" or "k".
func labelTerms(f client.Filters) []string {
	var out []string
	for t := range f["label"] {
		out = append(out, t)
	}
	return out
}

func matchLabels(labels map[string]string, terms []string) bool {
	for _, t := range terms {
		k, v, hasV := strings.Cut(t, "=")
		got, ok := labels[k]
		if !ok || (hasV && got != v) {
			return false
		}
	}
	return true
}

// volumeUsers lists the containers that mount a volume.
func (e *Engine) volumeUsers(ctx context.Context, name string) ([]string, error) {
	ctx = e.ns(ctx)
	dir, err := e.volumeData(name)
	if err != nil {
		return nil, err
	}
	cs, err := e.c.Containers(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range cs {
		s, err := c.Spec(ctx)
		if err != nil {
			continue
		}
		for _, m := range s.Mounts {
			if m.Source == dir {
				out = append(out, c.ID())
				break
			}
		}
	}
	return out, nil
}
