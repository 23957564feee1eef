package shim

import (
	"bytes"
	"encoding/json"
)

// What the helper's stream may hold, and so what the broker may read and
// the engine's log store: chunk and path sizes, the frame encoding they are
// counted in, and the bounds that follow from a job's limits.

// DataChunk is the payload of every artifact data frame but a file's last.
const DataChunk = 256 << 10

// maxPathBytes bounds the path in a file header or rejected frame: the
// collector refuses a longer path, and lists it under a name at most a
// component (255 bytes) longer.
const maxPathBytes = 4096 + 256

// MaxRejectedFrames bounds the rejected frames of one collection; three
// summary ones may follow.
const MaxRejectedFrames = 1000

// MarshalFrame is json.Marshal without HTML escaping: a path of valid
// UTF-8 without control characters (all the collector sends) takes at most
// twice its length in JSON, which StreamBound counts on.
func MarshalFrame(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// StreamBound is the most bytes the helper writes, before stuffing, for a
// job with these limits: its hello, at most logBytes of stdout and of
// stderr (in frames of at least one byte), each artifact's header, data
// in full chunks and end, the rejected entries, the summary and the
// status or error frame.
func StreamBound(logBytes, outputBytes, fileCount int64) int64 {
	const hdr = 5
	const small = 2*MaxFrame + 4096 // hello, summary, status, error
	perFile := 3*hdr + 2*maxPathBytes + 64
	perReject := hdr + 2*(maxPathBytes+1024) + 64
	return small +
		2*(logBytes*(hdr+1)) +
		fileCount*int64(perFile) + outputBytes + hdr*(outputBytes/DataChunk+1) +
		(MaxRejectedFrames+3)*int64(perReject)
}

// LogBound is the most bytes the engine's "local" log driver stores for a
// job with these limits: the stuffed stream (at most twice StreamBound),
// in records of 16 KiB, each about 100 bytes more, and 1 MiB to spare.
func LogBound(logBytes, outputBytes, fileCount int64) int64 {
	s := 2 * StreamBound(logBytes, outputBytes, fileCount)
	return s + s/64 + 1<<20
}
