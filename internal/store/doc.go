// Package store is sandboxd's content-addressed blob store on the host: blobs
// named by their SHA-256 digest, written to a temp file (unnamed where the
// file system allows it), synced, and then linked or renamed into place, so
// that a reader never sees a partial blob and concurrent writers of the same
// content are safe. A Batch puts many blobs in place with one sync of the
// blob directory instead of one per blob, and writes those past its first
// few into one pack (pack.go): one file, one sync, every member still a
// blob of its own digest.
//
// A blob's name is derived from the bytes actually written, never from a
// caller's claim; a claimed digest is checked and a mismatch leaves nothing
// behind. Content the store already holds is compared with the stored copy
// (a file or a pack's member), which is kept only if it holds exactly those
// bytes.
//
// A store is used by one process, or shared (Share) by processes that run
// side by side on one directory: then a sweep of one never removes what
// another claims or has used since it began.
package store
