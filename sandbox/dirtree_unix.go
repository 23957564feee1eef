//go:build unix

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// WriteDirTree writes directory dir in the canonical tar form (WriteTree)
// and returns its digest. It reads the directory as sandboxd's workspace
// reader does: directories and regular files only (a symbolic link, FIFO,
// socket or device anywhere is refused, naming it), nothing outside dir
// (every open goes through an os.Root), and each file opened without
// following a link, without blocking, and checked to be the very file the
// walk listed (same inode, regular, same size and modification time): a file swapped for a link
// or a FIFO between the walk and the read is refused, never followed or
// waited on.
func WriteDirTree(w io.Writer, dir string) (string, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", dir, err)
	}
	defer root.Close()
	var entries []TreeEntry
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		info, err := root.Lstat(name)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			entries = append(entries, TreeEntry{Name: name, Dir: true})
		case info.Mode().IsRegular():
			entries = append(entries, TreeEntry{Name: name, Size: info.Size(), Exec: info.Mode()&0o100 != 0,
				Open: func() (io.ReadCloser, error) { return openListed(root, name, info) }})
		default:
			return fmt.Errorf("%s: %w: %s is not a directory or regular file", name, ErrInvalid, info.Mode().Type())
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", dir, err)
	}
	d, err := WriteTree(w, entries)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", dir, err)
	}
	return d, nil
}

// openListed opens name in root as the regular file info describes.
func openListed(root *os.Root, name string, info fs.FileInfo) (io.ReadCloser, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: %w: became a symbolic link while it was read", name, ErrInvalid)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w: cannot be opened as the file listed: %v", name, ErrInvalid, err)
	}
	got, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !got.Mode().IsRegular() || !os.SameFile(got, info) || got.Size() != info.Size() || !got.ModTime().Equal(info.ModTime()) {
		f.Close()
		return nil, fmt.Errorf("%s: %w: changed while it was read (now %s, %d bytes)", path.Clean(name), ErrInvalid, got.Mode().Type(), got.Size())
	}
	return f, nil
}
