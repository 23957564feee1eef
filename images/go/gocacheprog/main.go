// Command gocacheprog lets the go command read the go image's build cache
// where it lies, read-only, instead of from a copy: it is a GOCACHEPROG
// (cmd/go/internal/cacheprog) over two directories of the go command's own
// cache layout (an action entry DIR/xx/ACTION-a, "v1 ACTION OUTPUT SIZE
// TIME", and its output DIR/xx/OUTPUT-d):
//
//	GOCACHEPROG="/usr/local/bin/gocacheprog /usr/local/share/gocache /tmp/gocache-new"
//
// A get is answered from the writable directory, else from the read-only
// one, and the go command reads the output file in place; a put goes to the
// writable directory only, which should be $GOCACHE itself. This program
// never writes the read-only directory, and it must be read-only to the go
// command too, as the image's is in every sandbox (the root file system,
// or a read-only volume): for an output it hands over that lies outside
// $GOCACHE, cmd/go tries to move the file before it copies it. So whatever
// runs in a job cannot change the image's cache, for itself or for anyone,
// and a job need not copy the cache (about 100 MB of its scratch space,
// which counts against its memory) before it builds.
//
// An entry that is not exactly of the go command's form, or whose output
// is missing or of another size, is a miss, as it is for the go command's
// own cache. But the go command stops if this program cannot be started
// or fails: a grader must not take that for the candidate's failure
// (examples/go-cli builds a program of its own before it says a candidate
// does not build).
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 3 || !filepath.IsAbs(os.Args[1]) || !filepath.IsAbs(os.Args[2]) {
		fmt.Fprintln(os.Stderr, "usage: gocacheprog READ-ONLY-DIR WRITABLE-DIR (both absolute; set as GOCACHEPROG)")
		os.Exit(2)
	}
	if err := serve(os.Args[1], os.Args[2], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gocacheprog:", err)
		os.Exit(1)
	}
}

// request and response are the protocol's messages (cacheprog.Request and
// cacheprog.Response), with the fields this program uses.
type request struct {
	ID       int64
	Command  string
	ActionID []byte `json:",omitempty"`
	OutputID []byte `json:",omitempty"`
	BodySize int64  `json:",omitempty"`
}

type response struct {
	ID            int64
	Err           string     `json:",omitempty"`
	KnownCommands []string   `json:",omitempty"`
	Miss          bool       `json:",omitempty"`
	OutputID      []byte     `json:",omitempty"`
	Size          int64      `json:",omitempty"`
	Time          *time.Time `json:",omitempty"`
	DiskPath      string     `json:",omitempty"`
}

// ownDir refuses a writable directory that is a link, that another uid
// owns, or that other uids may write: what another uid (the code uid of a
// job, say) put there would be answered as this build's own output.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory (%v)", dir, fi.Mode().Type())
	case !ok:
		return fmt.Errorf("%s: its owner is not known", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s is uid %d's, not this program's (%d)", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s may be written by other uids (mode %v)", dir, fi.Mode().Perm())
	}
	return nil
}

// maxRequest bounds a request's line (its IDs and size; a body follows on
// a line of its own).
const maxRequest = 1 << 16

// serve answers the go command's requests on in until it asks to close or
// in ends.
func serve(ro, rw string, in io.Reader, out io.Writer) error {
	if err := os.MkdirAll(rw, 0o755); err != nil {
		return err
	}
	if err := ownDir(rw); err != nil {
		return err
	}
	br := bufio.NewReaderSize(in, maxRequest)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	if err := enc.Encode(response{KnownCommands: []string{"get", "put", "close"}}); err != nil {
		return err
	}
	for {
		if err := w.Flush(); err != nil {
			return err
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("request (at most %d bytes, one line): %w", maxRequest, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // the go command ends each request with a blank line
		}
		var r request
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("request: %w", err)
		}
		var res response
		switch r.Command {
		case "get":
			res = get(ro, rw, r.ActionID)
		case "put":
			body := io.Reader(bytes.NewReader(nil))
			if r.BodySize > 0 {
				// The body follows on its own line, a JSON string of its
				// base64 (no escapes in that alphabet); it is decoded on
				// its way to the file, and read to its end even if the put
				// fails.
				q, err := openQuote(br)
				if err != nil {
					return fmt.Errorf("put %d: body: %w", r.ID, err)
				}
				body = base64.NewDecoder(base64.StdEncoding, q)
				res = put(rw, r, body)
				if _, err := io.Copy(io.Discard, q); err != nil {
					return fmt.Errorf("put %d: body: %w", r.ID, err)
				}
				if err := closeQuote(br); err != nil {
					return fmt.Errorf("put %d: body: %w", r.ID, err)
				}
			} else {
				res = put(rw, r, body)
			}
		case "close":
			if err := enc.Encode(response{ID: r.ID}); err != nil {
				return err
			}
			return w.Flush()
		default:
			res = response{Err: fmt.Sprintf("unknown command %q", r.Command)}
		}
		res.ID = r.ID
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
}

// quoted reads a JSON string's characters up to its closing quote, which
// it leaves unread.
type quoted struct {
	br   *bufio.Reader
	done bool
}

func openQuote(br *bufio.Reader) (*quoted, error) {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		switch c {
		case ' ', '\t', '\r', '\n':
		case '"':
			return &quoted{br: br}, nil
		default:
			return nil, fmt.Errorf("%q where a string was to begin", c)
		}
	}
}

func (q *quoted) Read(p []byte) (int, error) {
	if q.done {
		return 0, io.EOF
	}
	if _, err := q.br.Peek(1); err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	b, _ := q.br.Peek(min(len(p), q.br.Buffered()))
	n := bytes.IndexByte(b, '"')
	if n == 0 {
		q.done = true
		return 0, io.EOF
	}
	if n < 0 {
		n = len(b)
	}
	if bytes.IndexByte(b[:n], '\\') >= 0 {
		return 0, errors.New("an escape in a base64 body")
	}
	return q.br.Read(p[:n])
}

// closeQuote reads the closing quote and the end of the line.
func closeQuote(br *bufio.Reader) error {
	if c, err := br.ReadByte(); err != nil || c != '"' {
		return fmt.Errorf("no closing quote (%v)", err)
	}
	if c, err := br.ReadByte(); err != nil || c != '\n' {
		return fmt.Errorf("no end of line after the body (%v)", err)
	}
	return nil
}

// An action entry is "v1 ACTION OUTPUT SIZE TIME\n", the IDs in hex, SIZE
// and TIME (Unix nanoseconds) right-aligned in 20 columns, as the go
// command writes it.
const (
	hexSize   = 2 * sha256.Size
	entrySize = 2 + 1 + hexSize + 1 + hexSize + 1 + 20 + 1 + 20 + 1
)

func get(ro, rw string, action []byte) response {
	if len(action) != sha256.Size {
		return response{Err: fmt.Sprintf("action ID of %d bytes, want %d", len(action), sha256.Size)}
	}
	a := hex.EncodeToString(action)
	for _, dir := range []string{rw, ro} {
		if res, ok := lookup(dir, a); ok {
			return res
		}
	}
	return response{Miss: true}
}

// lookup reads action a's entry in dir and checks its output file.
func lookup(dir, a string) (response, bool) {
	b, err := readAtMost(filepath.Join(dir, a[:2], a+"-a"), entrySize+1)
	if err != nil || len(b) != entrySize || string(b[:3]) != "v1 " || string(b[3:3+hexSize]) != a ||
		b[3+hexSize] != ' ' || b[4+2*hexSize] != ' ' || b[25+2*hexSize] != ' ' || b[entrySize-1] != '\n' {
		return response{}, false
	}
	o := string(b[4+hexSize : 4+2*hexSize])
	output, err := hex.DecodeString(o)
	if err != nil {
		return response{}, false
	}
	size, err1 := strconv.ParseInt(string(bytes.TrimLeft(b[5+2*hexSize:25+2*hexSize], " ")), 10, 64)
	ns, err2 := strconv.ParseInt(string(bytes.TrimLeft(b[26+2*hexSize:entrySize-1], " ")), 10, 64)
	if err1 != nil || err2 != nil || size < 0 || ns < 0 {
		return response{}, false
	}
	p := filepath.Join(dir, o[:2], o+"-d")
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || st.Size() != size {
		return response{}, false
	}
	t := time.Unix(0, ns)
	return response{OutputID: output, Size: size, Time: &t, DiskPath: p}, true
}

func readAtMost(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// put stores body as action r.ActionID's output in rw: the output file
// first (checked against its size and digest as it is written), then the
// entry that names it, each written whole under a temporary name and
// renamed, so a get never sees half of either.
func put(rw string, r request, body io.Reader) response {
	if len(r.ActionID) != sha256.Size || len(r.OutputID) != sha256.Size {
		return response{Err: "put: action and output IDs must be SHA-256 digests"}
	}
	a, o := hex.EncodeToString(r.ActionID), hex.EncodeToString(r.OutputID)
	p := filepath.Join(rw, o[:2], o+"-d")
	err := writeWhole(p, func(f *os.File) error {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, r.BodySize+1))
		switch {
		case err != nil:
			return err
		case n != r.BodySize:
			return fmt.Errorf("body of %d bytes, BodySize %d", n, r.BodySize)
		case !bytes.Equal(h.Sum(nil), r.OutputID):
			return errors.New("the output ID is not the SHA-256 of the body")
		}
		return nil
	})
	if err != nil {
		return response{Err: "put: " + err.Error()}
	}
	entry := fmt.Sprintf("v1 %s %s %20d %20d\n", a, o, r.BodySize, time.Now().UnixNano())
	err = writeWhole(filepath.Join(rw, a[:2], a+"-a"), func(f *os.File) error {
		_, err := f.WriteString(entry)
		return err
	})
	if err != nil {
		return response{Err: "put: " + err.Error()}
	}
	return response{DiskPath: p}
}

// writeWhole makes the file p from what write writes, or nothing.
func writeWhole(p string, write func(*os.File) error) error {
	// Only this (the grader's) uid may add to the directory.
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	err = write(f)
	if err == nil {
		err = f.Chmod(0o644) // as the go command's own cache under umask 022
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
