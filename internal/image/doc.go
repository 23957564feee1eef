// Package image builds evaluator images locally, without any registry: it
// reads an image spec (images/<name>/image.json) naming files, trees and
// links taken from this machine, or pinned Debian packages fetched by this
// machine's apt and unpacked without running their scripts, writes one
// deterministic layer (sorted entries, zero times and owners) and a config
// with no timestamps, and loads the result into the engine as a
// docker-archive. The same inputs always
// give the same image ID, and an image already present is not loaded again.
//
// It never pulls, never runs a build container and never reads a Dockerfile.
// Import loads an image someone else built (a docker save tarball or an OCI
// image-layout archive), untagged, and returns its ID.
package image
