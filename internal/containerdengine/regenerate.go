package containerdengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/broker"
)

// The rows of the security table bound what they read; a spec holds more
// (annotations, unified cgroup files, rlimits, mount options, a cgroup
// path, fields newer runtimes read that this spec version does not name).
// So the spec containerd holds must also be, field for field, the one this
// engine makes from the container's create options, made again before
// each task and each update. Those options are kept by the engine, in the
// container's own directory under StateDir, never in containerd's record:
// whoever can write the record (its spec, labels, runtime) cannot write
// what it is compared with, and the spec made again depends only on the
// engine's code, its configuration, the kept options and the record's ID.

// createInputs are what specFor made a container's spec from.
type createInputs struct {
	Config     *container.Config     `json:"config"`
	HostConfig *container.HostConfig `json:"host_config"`
	ImageEnv   []string              `json:"image_env"` // the image config's environment
}

// createFile holds a container's createInputs, in its directory.
const createFile = "create.json"

// keepInputs writes a container's create inputs, replacing any before
// them in one rename.
func (e *Engine) keepInputs(id string, in createInputs) error {
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("container %s: create options: %w", id, err)
	}
	f, err := os.CreateTemp(e.ioDir(id), createFile+".*")
	if err != nil {
		return fmt.Errorf("container %s: create options: %w", id, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(e.ioDir(id), createFile))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("container %s: create options: %w", id, err)
	}
	return nil
}

// keptInputs reads a container's create inputs. A container without them
// (made by another engine, or before this check existed) never gets a
// task.
func (e *Engine) keptInputs(id string) (createInputs, error) {
	b, err := os.ReadFile(filepath.Join(e.ioDir(id), createFile))
	if errors.Is(err, fs.ErrNotExist) {
		return createInputs{}, fmt.Errorf("the engine kept no create options for it: %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return createInputs{}, fmt.Errorf("create options: %w", err)
	}
	var in createInputs
	if err := json.Unmarshal(b, &in); err != nil {
		return createInputs{}, fmt.Errorf("create options kept for it: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	if in.Config == nil || in.HostConfig == nil {
		return createInputs{}, fmt.Errorf("create options kept for it have no config: %w", errdefs.ErrFailedPrecondition)
	}
	return in, nil
}

// regenerate is the spec this engine makes from in for the container id.
func (e *Engine) regenerate(in createInputs, id string) (*specs.Spec, error) {
	return e.specFor(client.ContainerCreateOptions{Config: in.Config, HostConfig: in.HostConfig},
		imageInfo{id: in.Config.Image, env: in.ImageEnv}, id)
}

// checkRecord is the check before a container gets a task: its spec, as
// containerd's record holds it, passes every row of the security table
// and is the spec made again from its kept create options, on the runtime
// and root view those options give. It returns the spec and the options.
func (e *Engine) checkRecord(info containers.Container) (*specs.Spec, createInputs, error) {
	spec, err := specOf(info)
	if err != nil {
		return nil, createInputs{}, err
	}
	if err := checkSandboxSpec(e, spec); err != nil {
		return nil, createInputs{}, err
	}
	in, err := e.keptInputs(info.ID)
	if err != nil {
		return nil, createInputs{}, err
	}
	if err := e.checkMadeFrom(info, in); err != nil {
		return nil, createInputs{}, err
	}
	return spec, in, nil
}

// checkMadeFrom compares a record with what in makes of it: the spec, as
// the JSON containerd hands the runtime, field for field; the runtime; the
// snapshotter and the root view.
func (e *Engine) checkMadeFrom(info containers.Container, in createInputs) error {
	want, err := e.regenerate(in, info.ID)
	if err != nil {
		return fmt.Errorf("the spec made again from its create options: %w", err)
	}
	wantJSON, err := json.Marshal(want)
	if err != nil {
		return err
	}
	if info.Spec == nil {
		return fmt.Errorf("container %s has no spec", info.ID)
	}
	if err := sameJSON(wantJSON, info.Spec.GetValue()); err != nil {
		return fmt.Errorf("spec differs from the one made again from its create options: %w", err)
	}
	runtime, err := e.runtimeOf(info.Runtime)
	if err != nil {
		return err
	}
	if r := orDefault(in.HostConfig.Runtime, "runc"); runtime != r {
		return &broker.SettingError{Setting: "runtime", Want: r, Got: runtime}
	}
	view, _, _ := rootfsView(in.Config.Image, mountTargets(want), resolverOf(in.HostConfig))
	if info.Snapshotter != e.cfg.Snapshotter || info.SnapshotKey != view {
		return &broker.SettingError{Setting: "rootfs", Want: e.cfg.Snapshotter + " " + view, Got: info.Snapshotter + " " + info.SnapshotKey}
	}
	return nil
}

// updated is in with the memory limits of r, and the spec it makes: what
// an update writes, so that the spec made again from the kept options
// stays the one containerd holds. The spec passes the rows first.
func (e *Engine) updated(in createInputs, id string, r *container.Resources) (createInputs, *specs.Spec, error) {
	hc := *in.HostConfig
	hc.Memory, hc.MemorySwap = r.Memory, r.MemorySwap
	in.HostConfig = &hc
	spec, err := e.regenerate(in, id)
	if err != nil {
		return createInputs{}, nil, err
	}
	if err := checkSandboxSpec(e, spec); err != nil {
		return createInputs{}, nil, err
	}
	return in, spec, nil
}

// sameJSON compares two JSON documents as a Go runtime reads them: a null
// is an absent field, nothing else is (an empty object or list is not
// absent: runc reads "capabilities": {} as none and no key as all). A
// document that names a key twice is refused: Go's decoder merges the two
// values into one struct, so each half could look harmless alone. The
// error names the first path, in sorted key order, where they differ.
func sameJSON(want, got []byte) error {
	if bytes.Equal(want, got) {
		return nil // as this engine wrote it: the common case, without decoding
	}
	w, err := decodeJSON(want)
	if err != nil {
		return fmt.Errorf("the made spec: %w", err)
	}
	g, err := decodeJSON(got)
	if err != nil {
		return &broker.SettingError{Setting: "oci", Want: "one JSON object, each key once", Got: err.Error()}
	}
	if path, wv, gv, differ := firstDiff("", w, g); differ {
		return &broker.SettingError{Setting: "oci" + path, Want: jsonText(wv), Got: jsonText(gv)}
	}
	return nil
}

// absent stands for a missing field (or a null) in firstDiff's answer.
type absent struct{}

// firstDiff is the first path at which got differs from want, with the
// two values there.
func firstDiff(path string, want, got any) (string, any, any, bool) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path, want, got, true
		}
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range slices.Compact(keys) {
			wv, gv := w[k], g[k]
			switch {
			case wv == nil && gv == nil:
				continue
			case wv == nil:
				wv = absent{}
			case gv == nil:
				gv = absent{}
			}
			if p, a, b, differ := firstDiff(path+keyPath(k), wv, gv); differ {
				return p, a, b, true
			}
		}
		return "", nil, nil, false
	case []any:
		g, ok := got.([]any)
		if !ok {
			return path, want, got, true
		}
		for i := range max(len(w), len(g)) {
			var wv, gv any = absent{}, absent{}
			if i < len(w) {
				wv = w[i]
			}
			if i < len(g) {
				gv = g[i]
			}
			if p, a, b, differ := firstDiff(path+"["+strconv.Itoa(i)+"]", wv, gv); differ {
				return p, a, b, true
			}
		}
		return "", nil, nil, false
	default:
		// Strings, json.Numbers (compared as written), bools, nulls in
		// lists, absent.
		if want != got {
			return path, want, got, true
		}
		return "", nil, nil, false
	}
}

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func keyPath(k string) string {
	if plainKey.MatchString(k) {
		return "." + k
	}
	return "[" + strconv.Quote(k) + "]"
}

// jsonText is a value of firstDiff's answer as a short text.
func jsonText(v any) string {
	if _, ok := v.(absent); ok {
		return "absent"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	const most = 160
	if len(b) > most {
		return string(b[:most]) + fmt.Sprintf("… (%d bytes)", len(b))
	}
	return string(b)
}

// decodeJSON decodes one JSON value, numbers as written, refusing a key
// named twice in an object and anything after the value.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		m := map[string]any{}
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			key := k.(string) // the decoder checks that a key is a string
			if _, dup := m[key]; dup {
				return nil, fmt.Errorf("key %q twice in one object", key)
			}
			if m[key], err = decodeValue(d); err != nil {
				return nil, err
			}
		}
		_, err := d.Token() // }
		return m, err
	case json.Delim('['):
		l := []any{}
		for d.More() {
			v, err := decodeValue(d)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		_, err := d.Token() // ]
		return l, err
	}
	return t, nil
}
