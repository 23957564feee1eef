package containerdengine

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Copies reach only a container's volumes: its root filesystem is the
// image's shared read-only view and its scratch is tmpfs inside the task.

// volumeAt returns the volume directory mounted at the container path p,
// and p relative to it ("" for the mount point itself).
func (e *Engine) volumeAt(s *specs.Spec, p string) (dir, rel, target string, err error) {
	p = path.Clean("/" + p)
	volRoot := filepath.Join(e.cfg.StateDir, "volumes") + "/"
	best := ""
	for _, m := range s.Mounts {
		if m.Type != "bind" || !strings.HasPrefix(m.Source, volRoot) {
			continue
		}
		if (p == m.Destination || strings.HasPrefix(p, m.Destination+"/")) && len(m.Destination) > len(best) {
			best, dir = m.Destination, m.Source
		}
	}
	if best == "" {
		return "", "", "", fmt.Errorf("path %s is on no volume of the container (the containerd engine copies only to and from volumes): %w", p, errdefs.ErrNotImplemented)
	}
	return dir, strings.TrimPrefix(strings.TrimPrefix(p, best), "/"), best, nil
}

// CopyToContainer extracts a tar of directories and regular files into the
// volumes it lands on. An entry naming a volume's mount point sets the
// mode (and with CopyUIDGID the owner) of the volume's root.
func (e *Engine) CopyToContainer(ctx context.Context, id string, opts client.CopyToContainerOptions) (client.CopyToContainerResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.CopyToContainerResult{}, err
	}
	s, err := c.Spec(ctx)
	if err != nil {
		return client.CopyToContainerResult{}, err
	}
	roots := map[string]*os.Root{}
	defer func() {
		for _, r := range roots {
			r.Close()
		}
	}()
	tr := tar.NewReader(opts.Content)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return client.CopyToContainerResult{}, nil
		}
		if err != nil {
			return client.CopyToContainerResult{}, fmt.Errorf("copy to %s: %w", id, err)
		}
		name := path.Clean("/" + h.Name)
		if strings.Contains(h.Name, "..") {
			return client.CopyToContainerResult{}, fmt.Errorf("copy to %s: entry %q: %w", id, h.Name, errdefs.ErrInvalidArgument)
		}
		dir, rel, _, err := e.volumeAt(s, path.Join(opts.DestinationPath, name))
		if err != nil {
			return client.CopyToContainerResult{}, err
		}
		root := roots[dir]
		if root == nil {
			if root, err = os.OpenRoot(dir); err != nil {
				return client.CopyToContainerResult{}, err
			}
			roots[dir] = root
		}
		uid, gid := 0, 0
		if opts.CopyUIDGID {
			uid, gid = h.Uid, h.Gid
		}
		mode := fs.FileMode(h.Mode & 0o777)
		target := rel
		if target == "" {
			target = "."
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if target != "." {
				if err := root.MkdirAll(target, 0o755); err != nil {
					return client.CopyToContainerResult{}, err
				}
			}
		case tar.TypeReg:
			if target == "." {
				return client.CopyToContainerResult{}, fmt.Errorf("copy to %s: a file onto a volume root: %w", id, errdefs.ErrInvalidArgument)
			}
			if d := path.Dir(target); d != "." {
				if err := root.MkdirAll(d, 0o755); err != nil {
					return client.CopyToContainerResult{}, err
				}
			}
			f, err := root.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
			if err != nil {
				return client.CopyToContainerResult{}, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return client.CopyToContainerResult{}, err
			}
		default:
			return client.CopyToContainerResult{}, fmt.Errorf("copy to %s: entry %q of type %c: only directories and regular files: %w", id, h.Name, h.Typeflag, errdefs.ErrInvalidArgument)
		}
		if err := errors.Join(root.Lchown(target, uid, gid), root.Chmod(target, mode)); err != nil {
			return client.CopyToContainerResult{}, err
		}
	}
}

// CopyFromContainer returns a tar of the volume directory at SourcePath,
// its entries under the path's base name, as Docker's archive API does.
func (e *Engine) CopyFromContainer(ctx context.Context, id string, opts client.CopyFromContainerOptions) (client.CopyFromContainerResult, error) {
	ctx = e.ns(ctx)
	c, err := e.load(ctx, id)
	if err != nil {
		return client.CopyFromContainerResult{}, err
	}
	s, err := c.Spec(ctx)
	if err != nil {
		return client.CopyFromContainerResult{}, err
	}
	dir, rel, target, err := e.volumeAt(s, opts.SourcePath)
	if err != nil {
		return client.CopyFromContainerResult{}, err
	}
	if rel != "" {
		return client.CopyFromContainerResult{}, fmt.Errorf("copy from %s: only a whole volume (%s), not %s: %w", id, target, opts.SourcePath, errdefs.ErrNotImplemented)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return client.CopyFromContainerResult{}, err
	}
	base := path.Base(target)
	pr, pw := io.Pipe()
	go func() {
		defer root.Close()
		pw.CloseWithError(writeTree(tar.NewWriter(pw), root, base))
	}()
	st, _ := os.Lstat(dir)
	ps := container.PathStat{Name: base}
	if st != nil {
		ps.Mode, ps.Mtime = st.Mode(), st.ModTime()
	}
	return client.CopyFromContainerResult{Content: pr, Stat: ps}, nil
}

func writeTree(tw *tar.Writer, root *os.Root, base string) error {
	var walk func(rel string) error
	walk = func(rel string) error {
		p := rel
		if p == "" {
			p = "."
		}
		st, err := root.Lstat(p)
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(st, "")
		if err != nil {
			return err
		}
		h.Name = path.Join(base, rel)
		h.Uname, h.Gname = "", ""
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(sys.Uid), int(sys.Gid)
		}
		switch {
		case st.IsDir():
			h.Name += "/"
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			d, err := root.Open(p)
			if err != nil {
				return err
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				return err
			}
			sort.Strings(names)
			for _, n := range names {
				if err := walk(path.Join(rel, n)); err != nil {
					return err
				}
			}
			return nil
		case st.Mode().IsRegular():
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, st.Size())
			f.Close()
			return err
		default:
			h.Size = 0
			return tw.WriteHeader(h) // listed, so that the content check fails on it
		}
	}
	if err := walk(""); err != nil {
		return err
	}
	return tw.Close()
}
