package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// A "debs" content unpacks Debian packages, each pinned to one version, into
// the image, the way dpkg would place their files but without running any
// maintainer script. The packages come from this machine's apt sources
// (`apt-get download`, which checks each file against the signed archive
// index) and are kept in the user cache directory, so a rebuild downloads
// nothing. The same pins give the same files and so the same image ID; the
// pins are recorded in the image config (label PackagesLabel).

// PackagesLabel is the image config label that lists the Debian packages an
// image was built from, as space-separated name=version pins.
const PackagesLabel = "org.sandboxd.image.debian-packages"

var pinRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+=[0-9A-Za-z.+~:-]+$`)

// addDebs places the files of every pinned package at dst ("/": the
// image's root), leaving out the paths c.Exclude names (and everything
// below them).
func addDebs(c Content, add func(*entry) error) error {
	files, err := fetchDebs(c.Packages)
	if err != nil {
		return err
	}
	for _, pin := range c.Packages {
		if err := unpackDeb(files[pin], c.Dst, c.Exclude, add); err != nil {
			return fmt.Errorf("debs: %s: %w", pin, err)
		}
	}
	return nil
}

// debCache is where downloaded packages are kept, one file per pin.
func debCache() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "sandboxd", "debs"), nil
}

// debFile is the cache file of a pin: its name cannot be confused with
// another pin's, whatever characters the version holds.
func debFile(cache, pin string) string {
	return filepath.Join(cache, strings.NewReplacer(":", "%3a", "/", "_").Replace(pin)+".deb")
}

// fetchDebs returns the cached file of each pin, downloading the missing
// ones with apt-get and checking that each file is the package and version
// it was asked for.
func fetchDebs(pins []string) (map[string]string, error) {
	cache, err := debCache()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	files := map[string]string{}
	var missing []string
	for _, pin := range pins {
		f := debFile(cache, pin)
		files[pin] = f
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, pin)
		}
	}
	if len(missing) == 0 {
		return files, nil
	}
	tmp, err := os.MkdirTemp(cache, ".download-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", append([]string{"download", "-q"}, missing...)...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("debs: apt-get download: %w\n%s(is the package index current? `apt-get update`; is the version still in the archive?)", err, tail(out))
	}
	got, err := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if err != nil {
		return nil, err
	}
	for _, f := range got {
		out, err := exec.Command("dpkg-deb", "--show", "--showformat", "${Package}=${Version}", f).Output()
		if err != nil {
			return nil, fmt.Errorf("debs: dpkg-deb --show %s: %w", filepath.Base(f), err)
		}
		pin := string(out)
		if _, asked := files[pin]; !asked {
			return nil, fmt.Errorf("debs: apt-get download gave %s, which no pin asked for", pin)
		}
		if err := os.Rename(f, files[pin]); err != nil {
			return nil, err
		}
	}
	for _, pin := range missing {
		if _, err := os.Stat(files[pin]); err != nil {
			return nil, fmt.Errorf("debs: %s was not downloaded", pin)
		}
	}
	return files, nil
}

// unpackDeb adds the files of one package. Modes are normalized as for
// trees (0755 if executable, else 0644; no setuid), owners and times are
// dropped, and a hard link becomes a copy of the file it links to.
func unpackDeb(file, dst string, exclude []string, add func(*entry) error) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	err = readDebTar(out, dst, exclude, add)
	io.Copy(io.Discard, out)
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("dpkg-deb --fsys-tarfile: %w: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return err
}

func readDebTar(r io.Reader, dst string, exclude []string, add func(*entry) error) error {
	tr := tar.NewReader(r)
	data := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rel := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if rel == "." || rel == "" {
			continue
		}
		if strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
			return fmt.Errorf("%s leaves the root", h.Name)
		}
		if excludedPath(rel, exclude) {
			continue
		}
		name := strings.TrimPrefix(path.Join(dst, rel), "/")
		mode := int64(0o644)
		if h.Mode&0o111 != 0 {
			mode = 0o755
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = add(&entry{name: name, typ: tar.TypeDir, mode: 0o755})
		case tar.TypeReg:
			b, rerr := io.ReadAll(tr)
			if rerr != nil {
				return rerr
			}
			data[rel] = b
			err = add(&entry{name: name, typ: tar.TypeReg, mode: mode, text: b})
		case tar.TypeSymlink:
			err = add(&entry{name: name, typ: tar.TypeSymlink, mode: 0o777, linkname: h.Linkname})
		case tar.TypeLink:
			b, ok := data[path.Clean(strings.TrimPrefix(h.Linkname, "./"))]
			if !ok {
				return fmt.Errorf("hard link %s to %s, which is not in the package", h.Name, h.Linkname)
			}
			err = add(&entry{name: name, typ: tar.TypeReg, mode: mode, text: b})
		default:
			return fmt.Errorf("%s: tar entry type %q is never placed in images", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

// excludedPath reports whether rel is one of the excluded paths or below one.
func excludedPath(rel string, exclude []string) bool {
	for _, x := range exclude {
		x = strings.Trim(path.Clean(x), "/")
		if rel == x || strings.HasPrefix(rel, x+"/") {
			return true
		}
	}
	return false
}

// packagesLabel is the config label value of a spec's pins, sorted.
func packagesLabel(spec *Spec) string {
	var pins []string
	for _, c := range spec.Contents {
		if c.Type == "debs" {
			pins = append(pins, c.Packages...)
		}
	}
	sort.Strings(pins)
	return strings.Join(pins, " ")
}
