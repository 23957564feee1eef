// Package filedigest knows a file by its SHA-256 digest and remembers that
// digest across processes, for files that rarely change: sandboxd's own
// helper and probe binaries, which every one-shot command would otherwise
// read and hash (megabytes each) before its first job. A remembered digest
// is used only for the very file it was taken of (device, inode, size,
// modification and change times), and only if that file had not changed
// for a while when it was hashed; bytes read later are checked against the
// digest. It never trusts a memo over the file: anything it cannot match
// is hashed again.
package filedigest
