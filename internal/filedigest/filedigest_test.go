package filedigest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// settled makes files count as settled at once for the test's length.
func settled(t *testing.T) {
	old := settle
	settle = -time.Hour
	t.Cleanup(func() { settle = old })
}

func records(t *testing.T, memo string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(memo, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOpenHashesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bin")
	body := []byte("a helper binary")
	os.WriteFile(p, body, 0o755)
	f, err := Open(p, "")
	if err != nil {
		t.Fatal(err)
	}
	if f.Digest != digestOf(body) || f.Size != int64(len(body)) || f.Path != p {
		t.Fatalf("got %+v, want digest %s size %d", f, digestOf(body), len(body))
	}
	b, err := f.Read()
	if err != nil || string(b) != string(body) {
		t.Fatalf("Read: %q %v", b, err)
	}
}

// The memo answers for the very file it was taken of, and for nothing
// else: a record forged with another digest is believed only while the
// file's identity matches it, which proves the memo is what answered.
func TestTheMemoAnswersOnlyForTheSameFile(t *testing.T) {
	settled(t)
	dir, memo := t.TempDir(), t.TempDir()
	p := filepath.Join(dir, "bin")
	os.WriteFile(p, []byte("version 1"), 0o755)
	if _, err := Open(p, memo); err != nil {
		t.Fatal(err)
	}
	recs := records(t, memo)
	if len(recs) != 1 {
		t.Fatalf("records %v, want one", recs)
	}
	var r record
	b, _ := os.ReadFile(recs[0])
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	forged := digestOf([]byte("not the file"))
	r.Digest = forged
	b, _ = json.Marshal(r)
	os.WriteFile(recs[0], b, 0o600)
	f, err := Open(p, memo)
	if err != nil || f.Digest != forged {
		t.Fatalf("got %q %v, want the remembered %s (the memo was not used)", f.Digest, err, forged)
	}
	// Bytes read later are checked: the forged digest does not pass.
	if _, err := f.Read(); !errors.Is(err, ErrChanged) {
		t.Fatalf("Read under a wrong digest: %v, want ErrChanged", err)
	}

	// The file written again (same size): its identity moved on.
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(p, []byte("version 2"), 0o755)
	f, err = Open(p, memo)
	if err != nil || f.Digest != digestOf([]byte("version 2")) {
		t.Fatalf("after a change: got %q %v, want %s", f.Digest, err, digestOf([]byte("version 2")))
	}
	// Replaced by another file (a new inode) with the first bytes again.
	os.WriteFile(p+".new", []byte("version 1"), 0o755)
	os.Rename(p+".new", p)
	f, err = Open(p, memo)
	if err != nil || f.Digest != digestOf([]byte("version 1")) {
		t.Fatalf("after a replacement: got %q %v", f.Digest, err)
	}
}

// A record copied to another path's name is not that path's.
func TestARecordOfAnotherPathIsNotUsed(t *testing.T) {
	settled(t)
	dir, memo := t.TempDir(), t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("a"), 0o755)
	os.WriteFile(b, []byte("b"), 0o755)
	if _, err := Open(a, memo); err != nil {
		t.Fatal(err)
	}
	recA := records(t, memo)[0]
	recB, _ := recordPath(memo, b)
	raw, _ := os.ReadFile(recA)
	var r record
	json.Unmarshal(raw, &r)
	fb, _ := os.Open(b)
	r.Identity, _ = identify(fb) // b's own identity, a's path and digest
	fb.Close()
	raw, _ = json.Marshal(r)
	os.WriteFile(recB, raw, 0o600)
	f, err := Open(b, memo)
	if err != nil || f.Digest != digestOf([]byte("b")) {
		t.Fatalf("got %q %v, want b's own digest", f.Digest, err)
	}
}

// A file changed too recently is hashed but not remembered: a change
// within the same clock tick would not show in its times.
func TestAFreshFileIsNotRemembered(t *testing.T) {
	dir, memo := t.TempDir(), t.TempDir()
	p := filepath.Join(dir, "bin")
	os.WriteFile(p, []byte("just written"), 0o755)
	f, err := Open(p, memo)
	if err != nil || f.Digest != digestOf([]byte("just written")) {
		t.Fatalf("got %q %v", f.Digest, err)
	}
	if recs := records(t, memo); len(recs) != 0 {
		t.Fatalf("records %v for a file changed just now, want none", recs)
	}
}

// A memo that is garbage, or not there, only costs a read.
func TestABadMemoIsIgnored(t *testing.T) {
	settled(t)
	dir, memo := t.TempDir(), t.TempDir()
	p := filepath.Join(dir, "bin")
	os.WriteFile(p, []byte("x"), 0o755)
	rec, _ := recordPath(memo, p)
	for _, junk := range []string{"", "{", `{"digest":"sha256:zz"}`} {
		os.WriteFile(rec, []byte(junk), 0o600)
		if f, err := Open(p, memo); err != nil || f.Digest != digestOf([]byte("x")) {
			t.Fatalf("memo %q: got %q %v", junk, f.Digest, err)
		}
	}
	// A FIFO in a record's place neither blocks nor answers; nor does a
	// record too large to be one.
	os.Remove(rec)
	if err := syscall.Mkfifo(rec, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if f, err := Open(p, memo); err != nil || f.Digest != digestOf([]byte("x")) {
			t.Errorf("FIFO record: got %q %v", f.Digest, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Open blocked on a FIFO in a record's place")
	}
	os.Remove(rec)
	if _, err := Open(p, memo); err != nil { // writes a good record
		t.Fatal(err)
	}
	good, _ := os.ReadFile(rec)
	var r record
	json.Unmarshal(good, &r)
	r.Digest = digestOf([]byte("padded"))
	big, _ := json.Marshal(r)
	big = append(big, make([]byte, maxRecord)...) // trailing spaces: still valid JSON
	for i := len(big) - maxRecord; i < len(big); i++ {
		big[i] = ' '
	}
	os.WriteFile(rec, big, 0o600)
	if f, err := Open(p, memo); err != nil || f.Digest != digestOf([]byte("x")) {
		t.Fatalf("oversized record: got %q %v", f.Digest, err)
	}
	if f, err := Open(p, filepath.Join(dir, "bin", "not-a-dir")); err != nil || f.Digest != digestOf([]byte("x")) {
		t.Fatalf("unwritable memo: got %q %v", f.Digest, err)
	}
	if _, err := Open(dir, memo); err == nil {
		t.Fatal("a directory was given a digest")
	}
}
