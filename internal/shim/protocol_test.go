package shim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// frameBytes is the encoding the protocol promises: type, big-endian
// 32-bit length, payload. It is written out by hand so that a change of
// WriteFrame cannot pass by changing the reader with it.
func frameBytes(typ byte, payload []byte) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func TestWriteFrameEncoding(t *testing.T) {
	tests := []struct {
		name    string
		typ     byte
		payload []byte
	}{
		{"empty", FrameFileEnd, nil},
		{"short", FrameStdout, []byte("hello")},
		{"binary", FrameFileData, []byte{0, 0xff, 'S', 0, 0, 0, 1}},
		{"at the limit", FrameFileData, bytes.Repeat([]byte{'x'}, MaxFrame)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tt.typ, tt.payload); err != nil {
				t.Fatalf("WriteFrame: %v", err)
			}
			want := frameBytes(tt.typ, tt.payload)
			if got := buf.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("got %d bytes starting %q, want %d bytes starting %q", len(got), head(got), len(want), head(want))
			}
		})
	}
}

func head(b []byte) []byte { return b[:min(len(b), 16)] }

func TestWriteFrameRefusesOversizedPayload(t *testing.T) {
	var buf bytes.Buffer
	err := WriteFrame(&buf, FrameFileData, make([]byte, MaxFrame+1))
	if err == nil {
		t.Fatal("got no error for a payload of MaxFrame+1 bytes, want one")
	}
	if buf.Len() != 0 {
		t.Errorf("got %d bytes written for a refused frame, want 0 (nothing half-written)", buf.Len())
	}
}

// Every frame WriteFrame writes, FrameReader reads back unchanged, in
// order, and a clean end between frames is io.EOF.
func TestFramesRoundTrip(t *testing.T) {
	frames := []struct {
		typ     byte
		payload []byte
	}{
		{FrameHello, []byte(Hello + "0123456789abcdef")},
		{FrameStdout, bytes.Repeat([]byte("a"), 70000)},
		{FrameStderr, []byte("e")}, // shorter than the previous: the reused buffer must be cut
		{FrameFileBegin, []byte(`{"path":"/work/out/a","size":0}`)},
		{FrameFileEnd, nil},
		{FrameFileData, bytes.Repeat([]byte{0xfe}, MaxFrame)},
		{FrameStatus, []byte(`{}`)},
	}
	var buf bytes.Buffer
	for _, f := range frames {
		if err := WriteFrame(&buf, f.typ, f.payload); err != nil {
			t.Fatal(err)
		}
	}
	fr := NewFrameReader(&buf)
	for i, want := range frames {
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if typ != want.typ || !bytes.Equal(p, want.payload) {
			t.Errorf("frame %d: got %q with %d bytes, want %q with %d bytes", i, typ, len(p), want.typ, len(want.payload))
		}
	}
	if typ, _, err := fr.Next(); err != io.EOF {
		t.Errorf("after the last frame: got type %q, err %v, want io.EOF", typ, err)
	}
}

func TestFrameReaderRefusesBrokenStreams(t *testing.T) {
	oversized := []byte{FrameStdout, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(oversized[1:], MaxFrame+1)
	huge := []byte{FrameFileData, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name   string
		stream []byte
		// wantIs is the error class; wantText a word the message must name.
		wantIs   error
		wantText string
	}{
		{"one byte of header", []byte{FrameStatus}, io.ErrUnexpectedEOF, "header"},
		{"four bytes of header", []byte{FrameStatus, 0, 0, 0}, io.ErrUnexpectedEOF, "header"},
		{"payload cut short", frameBytes(FrameStdout, []byte("hello"))[:7], io.ErrUnexpectedEOF, "payload"},
		{"payload missing", frameBytes(FrameStdout, []byte("hello"))[:5], io.ErrUnexpectedEOF, "payload"},
		{"length one over the limit", oversized, ErrFrameTooLarge, "1048577"},
		{"length 4 GiB", huge, ErrFrameTooLarge, "4294967295"},
		{"oversized after a good frame", append(frameBytes(FrameStdout, []byte("x")), huge...), ErrFrameTooLarge, "'d'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr := NewFrameReader(bytes.NewReader(tt.stream))
			var err error
			for err == nil {
				_, _, err = fr.Next()
			}
			if !errors.Is(err, tt.wantIs) {
				t.Fatalf("got error %v, want one that is %v", err, tt.wantIs)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("got error %q, want it to name %q", err, tt.wantText)
			}
		})
	}
}

// A length header over the limit is refused before anything is read or
// allocated for it: the reader takes 5 bytes, not 4 GiB.
func TestFrameReaderDoesNotReadAnOversizedPayload(t *testing.T) {
	r := &countingReader{r: io.MultiReader(bytes.NewReader([]byte{FrameFileData, 0xff, 0xff, 0xff, 0xff}), endless{})}
	if _, _, err := NewFrameReader(r).Next(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	if r.n != 5 {
		t.Errorf("got %d bytes read, want 5 (the header only)", r.n)
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestWriteInputHeader(t *testing.T) {
	tests := []struct {
		size int64
		want []byte
	}{
		{0, []byte{0, 0, 0, 0, 0, 0, 0, 0}},
		{1, []byte{0, 0, 0, 0, 0, 0, 0, 1}},
		{1<<32 + 2, []byte{0, 0, 0, 1, 0, 0, 0, 2}},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := WriteInputHeader(&buf, tt.size); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), tt.want) {
			t.Errorf("size %d: got % x, want % x", tt.size, buf.Bytes(), tt.want)
		}
	}
}

// The JSON field names are the protocol between two binaries that may be
// built apart (the shim is installed next to the daemon): renaming a Go
// field must not rename what is on the wire.
func TestWireFieldNames(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"config", Config{Argv: []string{"go", "test"}, Env: []string{"A=1"}, WorkDir: "/work", UID: 1000, GID: 1000, CodeUID: 1001, CodeGID: 1001,
			Inputs: []string{"/work/src"}, MakeDirs: []string{"/work/out"}, Outputs: []string{"/work/out"}, Scratch: []string{"/tmp"},
			DeadlineMS: 5, LogBytes: 6, OutputBytes: 7, FileCount: 8, FileSize: 9, MaxInput: 10},
			`{"argv":["go","test"],"env":["A=1"],"workdir":"/work","uid":1000,"gid":1000,"code_uid":1001,"code_gid":1001,"inputs":["/work/src"],"make_dirs":["/work/out"],"outputs":["/work/out"],"scratch":["/tmp"],"deadline_ms":5,"log_bytes":6,"output_bytes":7,"file_count":8,"file_size_bytes":9,"max_input_bytes":10}`},
		{"config without a code uid", Config{Argv: []string{"true"}, UID: 1000, GID: 1000},
			`{"argv":["true"],"env":null,"workdir":"","uid":1000,"gid":1000,"inputs":null,"make_dirs":null,"outputs":null,"scratch":null,"deadline_ms":0,"log_bytes":0,"output_bytes":0,"file_count":0,"file_size_bytes":0,"max_input_bytes":0}`},
		{"file header", FileHeader{Path: "/work/out/a", Size: 3}, `{"path":"/work/out/a","size":3}`},
		{"rejected", Rejected{Path: "/work/out/l", Reason: "symbolic link"}, `{"path":"/work/out/l","reason":"symbolic link"}`},
		{"summary", CollectSummary{Files: 1, Bytes: 2, LimitsHit: []string{"file_count"}}, `{"files":1,"bytes":2,"limits_hit":["file_count"]}`},
		{"status", Status{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, LimitsHit: []string{}, StdoutTotal: 1, StderrTotal: 2,
			ScratchUsed: map[string]int64{"/tmp": 4096}, Leftover: true, Error: "survived", DurationMS: 3},
			`{"exit_code":137,"signal":"SIGKILL","timed_out":true,"limits_hit":[],"stdout_total":1,"stderr_total":2,"scratch_used":{"/tmp":4096},"leftover":true,"error":"survived","duration_ms":3}`},
	}
	for _, tt := range tests {
		got, err := json.Marshal(tt.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}
