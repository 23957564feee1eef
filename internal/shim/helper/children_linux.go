package helper

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// stageMain runs as the candidate user and extracts the writable inputs
// from stdin: for each input path in order, an 8-byte length and a tar;
// then the broker's go-ahead (shim.GoAhead), without which it fails.
func stageMain() int {
	cfg, err := childConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-shim stage:", err)
		return 1
	}
	unix.Umask(0o022)
	widenPipe(0)
	// One buffered reader for the whole of stdin: tar headers are 512
	// bytes, and a read per header was most of staging's syscalls.
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	for _, dst := range cfg.Inputs {
		var hdr [8]byte
		if _, err := io.ReadFull(in, hdr[:]); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxd-shim stage: input %s: %v\n", dst, err)
			return 1
		}
		n := int64(binary.BigEndian.Uint64(hdr[:]))
		if n < 0 || (cfg.MaxInput > 0 && n > cfg.MaxInput) {
			fmt.Fprintf(os.Stderr, "sandboxd-shim stage: input %s: %d bytes is over the limit\n", dst, n)
			return 1
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxd-shim stage: %v\n", err)
			return 1
		}
		lr := io.LimitReader(in, n)
		if err := extract(dst, lr); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxd-shim stage: input %s: %v\n", dst, err)
			return 1
		}
		// Consume any padding the tar reader left unread.
		io.Copy(io.Discard, lr)
	}
	// The broker checks each input as it sends it: only once all of them
	// passed does the go-ahead follow. Extracted but not confirmed, the
	// inputs are never run on.
	if len(cfg.Inputs) > 0 {
		if b, err := in.ReadByte(); err != nil || b != shim.GoAhead {
			fmt.Fprintln(os.Stderr, "sandboxd-shim stage: the broker did not confirm the inputs it sent (no go-ahead); nothing runs")
			return 1
		}
	}
	for _, d := range cfg.MakeDirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxd-shim stage: %v\n", err)
			return 1
		}
	}
	return 0
}

// extract writes a tar of directories and regular files under dst. The
// broker has already checked the tar; this re-checks every name, creates
// nothing but directories and new regular files, and never follows a link.
// Every name is resolved from dst's descriptor, not from the root: on a
// root file system served by FUSE (Docker's fuse-overlayfs), each walk
// from "/" by a user other than root asks the FUSE daemon for the root's
// ACL, one round trip per file.
func extract(dst string, r io.Reader) error {
	dirfd, err := openDirNoLinks(dst)
	if err != nil {
		return &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dirfd)
	tr := tar.NewReader(r)
	buf := make([]byte, 256<<10)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q is not a local path", h.Name)
		}
		p := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && err != unix.EEXIST {
				return &os.PathError{Op: "mkdir", Path: p, Err: err}
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("entry %q: not a directory", h.Name)
			}
		case tar.TypeReg:
			mode := uint32(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			// A raw descriptor: os.File would add non-blocking setup, a
			// poller registration and copy_file_range attempts per file.
			fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
			if err != nil {
				return &os.PathError{Op: "open", Path: p, Err: err}
			}
			_, err = io.CopyBuffer(fdWriter(fd), tr, buf)
			if cerr := unix.Close(fd); err == nil && cerr != nil {
				err = &os.PathError{Op: "close", Path: p, Err: cerr}
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %q is not a directory or regular file", h.Name, h.Typeflag)
		}
	}
}

// widenPipe makes the pipe at fd (stdin or stdout, from the engine's
// shim) hold 1 MiB instead of 64 KiB, if it is a pipe and the kernel lets
// it: the helper's 1 MiB reads and writes then pass in one call, not
// sixteen handovers with the shim. Nothing depends on it. The pages count
// against the pipe's creator (the shim's user, root without a user
// namespace) while the stage or the collection lasts; past the kernel's
// soft limit (pipe-user-pages-soft, 64 MiB by default), new pipes of
// unprivileged processes of that user get two pages, which costs speed,
// never correctness.
func widenPipe(fd int) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
		unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 1<<20)
	}
}

// fdWriter writes to a raw file descriptor.
type fdWriter int

func (f fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Write(int(f), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

type collector struct {
	o         *out
	remaining int64
	files     int64
	left      int64
	bytes     int64
	rejected  int
	dropped   int64
	overCount int64
	overBytes int64
	limits    map[string]bool
	buf       []byte
}

// collectMain runs as the candidate user after every candidate process is
// dead and streams the output directories' regular files as frames.
func collectMain() int {
	// Frames are buffered: the engine turns every write on the container's
	// stdout into at least one log record, and unbuffered, a small file
	// cost six writes (two per frame).
	cfg, err := childConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-shim collect:", err)
		return 1
	}
	widenPipe(1)
	w := bufio.NewWriterSize(shim.NewStuffWriter(os.Stdout), 1<<20)
	code := collectFrames(w, cfg)
	if err := w.Flush(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "sandboxd-shim collect:", err)
		return 1
	}
	return code
}

// collectFrames writes the frames of the output directories cfg names to
// w and returns the collector's exit code.
func collectFrames(w io.Writer, cfg *shim.Config) int {
	c := &collector{
		o:         &out{w: w},
		remaining: cfg.OutputBytes,
		left:      cfg.FileCount,
		limits:    map[string]bool{},
		buf:       make([]byte, shim.DataChunk),
	}
	for _, dir := range cfg.Outputs {
		// No component of the output path may be a link: the candidate
		// owns every directory below the scratch mount points.
		fd, err := openDirNoLinks(dir)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // an output directory the command never made holds nothing
			}
			c.reject(dir, "output directory: "+err.Error())
			continue
		}
		err = c.walk(fd, dir, 0)
		unix.Close(fd)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-shim collect:", err)
			return 1
		}
	}
	if cfg.FileSize > 0 && c.scratchHitFileSize(cfg.Scratch, cfg.FileSize, cfg.CodeUID) {
		c.limits["file_size_bytes"] = true
	}
	if c.overCount > 0 {
		c.o.json(shim.FrameRejected, shim.Rejected{Path: "", Reason: fmt.Sprintf("%d regular files not collected: file_count limit reached", c.overCount)})
	}
	if c.overBytes > 0 {
		c.o.json(shim.FrameRejected, shim.Rejected{Path: "", Reason: fmt.Sprintf("%d regular files not collected: output_bytes limit reached", c.overBytes)})
	}
	if c.dropped > 0 {
		c.o.json(shim.FrameRejected, shim.Rejected{Path: "", Reason: fmt.Sprintf("%d more rejected entries not listed", c.dropped)})
	}
	sum := emptyCollection()
	sum.Files, sum.Bytes = c.files, c.bytes
	for l := range c.limits {
		sum.LimitsHit = append(sum.LimitsHit, l)
	}
	sort.Strings(sum.LimitsHit)
	if err := c.o.json(shim.FrameCollected, sum); err != nil {
		return 1
	}
	return 0
}

// emptyCollection is the summary of a collection that found nothing.
func emptyCollection() shim.CollectSummary {
	return shim.CollectSummary{LimitsHit: []string{}}
}

func (c *collector) reject(path, reason string) {
	if c.rejected >= shim.MaxRejectedFrames {
		c.dropped++
		return
	}
	c.rejected++
	c.o.json(shim.FrameRejected, shim.Rejected{Path: path, Reason: reason})
}

const maxDepth = 64

func (c *collector) walk(dirfd int, dir string, depth int) error {
	if depth > maxDepth {
		c.reject(dir, "deeper than 64 levels")
		return nil
	}
	names, err := readDirNames(dirfd)
	if err != nil {
		c.reject(dir, "unreadable directory: "+err.Error())
		return nil
	}
	sort.Strings(names)
	for _, name := range names {
		p := dir + "/" + name
		if !acceptableName(name) {
			c.reject(sanitizeName(p), "unacceptable name (control character or invalid UTF-8)")
			continue
		}
		if len(p) > shim.MaxArtifactPath {
			// Nothing below it could be collected either: the signed
			// result bounds each artifact's path (sandbox.MaxResultBytes).
			c.reject(p, fmt.Sprintf("path longer than %d bytes", shim.MaxArtifactPath))
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			c.reject(p, "stat: "+err.Error())
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			fd, err := openChild(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o700)
			if err != nil {
				c.reject(p, "open directory: "+err.Error())
				continue
			}
			err = c.walk(fd, p, depth+1)
			unix.Close(fd)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := c.file(dirfd, name, p, &st); err != nil {
				return err
			}
		case unix.S_IFLNK:
			c.reject(p, "symbolic link (never followed)")
		case unix.S_IFIFO:
			c.reject(p, "FIFO")
		case unix.S_IFCHR, unix.S_IFBLK:
			c.reject(p, "device node")
		case unix.S_IFSOCK:
			c.reject(p, "socket")
		default:
			c.reject(p, "not a regular file")
		}
	}
	return nil
}

func (c *collector) file(dirfd int, name, p string, st *unix.Stat_t) error {
	// Files over a limit are counted, not listed one by one, so that a
	// flood of them cannot push links and FIFOs out of the bounded list.
	if c.left <= 0 {
		c.limits["file_count"] = true
		c.overCount++
		return nil
	}
	if st.Size > c.remaining {
		c.limits["output_bytes"] = true
		c.overBytes++
		return nil
	}
	fd, err := openChild(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		c.reject(p, "open: "+err.Error())
		return nil
	}
	// A raw descriptor, as in extract: os.File would try to register a
	// non-blocking descriptor with the poller, per file.
	defer unix.Close(fd)
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != unix.S_IFREG || st2.Size != st.Size {
		c.reject(p, "changed while being collected")
		return nil
	}
	hdr, _ := shim.MarshalFrame(shim.FileHeader{Path: p, Size: st.Size})
	if err := c.o.frame(shim.FrameFileBegin, hdr); err != nil {
		return err
	}
	var sent int64
	for sent < st.Size {
		// Each chunk but the last is full: the stream's size, and so its
		// log's, is bounded by the job's limits (see StreamBound).
		n, err := fillFD(fd, c.buf[:min(int64(len(c.buf)), st.Size-sent)])
		if n > 0 {
			if err := c.o.frame(shim.FrameFileData, c.buf[:n]); err != nil {
				return err
			}
			sent += int64(n)
		}
		if err != nil {
			// The header promised st.Size bytes; a short file is a protocol
			// error the broker reports.
			return fmt.Errorf("read %s: %w", p, err)
		}
	}
	if err := c.o.frame(shim.FrameFileEnd, nil); err != nil {
		return err
	}
	c.left--
	c.files++
	c.bytes += sent
	c.remaining -= sent
	return nil
}

// fillFD reads until p is full, the file ends or a read fails.
func fillFD(fd int, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := readFD(fd, p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// readFD reads from a raw descriptor; io.EOF at the end of the file.
func readFD(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// openChild opens name in dirfd; if the candidate removed the owner's
// permission bits, it restores them (the collector runs as the owner).
func openChild(dirfd int, name string, flags int, restore uint32) (int, error) {
	fd, err := unix.Openat(dirfd, name, flags, 0)
	if errors.Is(err, unix.EACCES) {
		if cerr := unix.Fchmodat(dirfd, name, restore, 0); cerr == nil {
			fd, err = unix.Openat(dirfd, name, flags, 0)
		}
	}
	return fd, err
}

func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// maxScan bounds the entries the file-size scan visits.
const maxScan = 200_000

// scratchHitFileSize reports whether any regular file in the scratch
// directories reached the file-size limit. It never follows links. A scan
// cut short by its bounds counts as a hit: it fails closed.
func (c *collector) scratchHitFileSize(dirs []string, limit int64, codeUID int) bool {
	seen := 0
	var walk func(dirfd int, depth int) bool
	walk = func(dirfd int, depth int) bool {
		if depth > maxDepth {
			return true
		}
		names, err := readDirNames(dirfd)
		if err != nil {
			return false
		}
		for _, name := range names {
			var st unix.Stat_t
			if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			// What the code uid made (the candidate's program, run by a
			// grader through the exec service) is not the job's own: it
			// must not be able to mark the grader's job as over a limit.
			if codeUID > 0 && int(st.Uid) == codeUID {
				continue
			}
			if seen++; seen > maxScan {
				return true
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				if st.Size >= limit {
					return true
				}
			case unix.S_IFDIR:
				fd, err := openChild(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o700)
				if err != nil {
					continue
				}
				hit := walk(fd, depth+1)
				unix.Close(fd)
				if hit {
					return true
				}
			}
		}
		return false
	}
	for _, d := range dirs {
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		hit := walk(fd, 0)
		unix.Close(fd)
		if hit {
			return true
		}
	}
	return false
}

// acceptableName refuses names the reader rules refuse anywhere else:
// control characters (C0, DEL, C1) and invalid UTF-8.
func acceptableName(name string) bool {
	if !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return true
}

// sanitizeName makes a refused name printable for the rejected list.
func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

// openDirNoLinks opens an absolute directory path none of whose components
// is a link: with openat2's RESOLVE_NO_SYMLINKS, or, where the kernel has
// no openat2 (gVisor's runsc does not implement it), one component at a
// time with O_NOFOLLOW, each relative to the one before.
func openDirNoLinks(dir string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
		return fd, err
	}
	return openDirByComponents(dir)
}

// openDirByComponents is openDirNoLinks without openat2.
func openDirByComponents(dir string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if !filepath.IsAbs(dir) {
		return -1, unix.EINVAL
	}
	fd, err := unix.Open("/", flags, 0)
	if err != nil {
		return -1, err
	}
	for _, name := range strings.Split(strings.Trim(filepath.Clean(dir), "/"), "/") {
		if name == "" {
			continue
		}
		if name == ".." {
			unix.Close(fd)
			return -1, unix.EINVAL
		}
		next, err := unix.Openat(fd, name, flags|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}
