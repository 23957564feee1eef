// Package store is sandboxd's content-addressed blob store on the host: blobs
// named by their SHA-256 digest, written by temp file, fsync and rename so
// that a reader never sees a partial blob and concurrent writers of the same
// content are safe.
//
// A blob's name is derived from the bytes actually written, never from a
// caller's claim; a claimed digest is checked and a mismatch leaves nothing
// behind.
package store
