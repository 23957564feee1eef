// Package shim is the protocol the broker and sandboxd's in-container
// helper (internal/shim/helper, the sandboxd-shim binary) speak over the
// container's stdio: the frame format, the Config frame the broker sends
// and the frames the helper answers with (Hello, stdout and stderr chunks,
// artifacts, rejected entries, the collection summary and Status).
//
// Both sides link this package; the daemon links nothing else of the
// helper's. It only encodes and decodes: it never starts a process, opens
// a file or touches the container, and it bounds every frame it reads
// (MaxFrame) before allocating for it. A decoded frame is still untrusted:
// the broker re-checks paths, types, counts and sizes and computes digests
// itself.
package shim
