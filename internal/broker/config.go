package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// Config configures a Broker. Only cmd/ fills it from flags or files.
type Config struct {
	// Name identifies this broker in labels and results.
	Name string
	// Version is the broker's version, recorded in every result.
	Version string
	// ShimPath is the static sandboxd-shim binary copied into the
	// read-only helper volume.
	ShimPath string
	// CandidateUID and CandidateGID are the ids candidate code runs as. They
	// must not be 0.
	CandidateUID, CandidateGID int
	// CodeUID and CodeGID are the second identity of the helper's exec
	// service: what a grader runs through `/.sandboxd/shim exec` cannot
	// reach the grader's files, descriptors or processes. 0 disables it.
	CodeUID, CodeGID int
	// AllowRunsc permits jobs that ask for the runsc runtime.
	AllowRunsc bool
	// CollectGrace is how long past the job's wall time the broker waits
	// for staging and collection before it kills the container.
	CollectGrace time.Duration
	// EngineTimeout bounds each short engine call (create, inspect, remove).
	EngineTimeout time.Duration
	// NProc is RLIMIT_NPROC of runc jobs. It counts every process of the
	// candidate uid on the host, so it is a host-wide backstop; the per-job
	// bound is the pids cgroup (Limits.Pids). A runsc job's RLIMIT_NPROC is
	// its Limits.Pids instead (see pidsLimits).
	NProc int64
	// CacheDir, if set, is where the broker records the cache volumes it
	// has checked by content, so that a new process of the same broker
	// does not read them back again; empty: each process checks each
	// volume once.
	CacheDir string
	// DigestMemo, if set, is where the helper binary's digest is remembered
	// across processes (internal/filedigest: only for the very file it was
	// taken of), so that a new process does not read and hash it before its
	// first job; empty: each process hashes it once.
	DigestMemo string
	// VolumePrefix starts the names of the broker's cache volumes (the
	// helper and read-only inputs, named by content digest).
	VolumePrefix string
	// ImageTrees says where the trees an image names in
	// sandbox.ImageTreesLabel are read from: ImageTreesAuto (from volumes
	// the broker fills from the image where the engine's storage driver is
	// fuse-overlayfs), ImageTreesOn (from volumes on any Docker engine) or
	// ImageTreesOff (from the image). See trees.go.
	ImageTrees string
	// PoolSize is how many started sandboxes the broker keeps ready for
	// each container shape (image, runtime, resource limits) a job without
	// read-only inputs has used; 0 disables the pool. See pool.go.
	PoolSize int
	// PoolIdle is how long a shape's sandboxes stay ready after the last
	// job of that shape.
	PoolIdle time.Duration
	// NameBeat is how often a daemon renews its hold on its name on the
	// engine (ClaimName); NameStale is how long a starting daemon watches
	// the hold of a process it cannot check (another host, container or
	// boot) for a renewal before it takes the name as a dead daemon's.
	NameBeat, NameStale time.Duration
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
}

// Default returns the configuration a one-shot `sandboxd run` uses.
func Default() Config {
	return Config{
		Name:          "sandboxd",
		Version:       "0.1.0-dev",
		CandidateUID:  65534,
		CandidateGID:  65534,
		CodeUID:       65533,
		CodeGID:       65533,
		CollectGrace:  30 * time.Second,
		EngineTimeout: 90 * time.Second, // a loaded engine has taken over 30 s to start a container
		NProc:         8192,
		VolumePrefix:  "sandboxd",
		PoolIdle:      10 * time.Minute,
		NameBeat:      5 * time.Second,
		NameStale:     45 * time.Second, // many beats: a holder's engine calls may be slow for a while
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case !validVolumePrefix(c.Name):
		return fmt.Errorf("broker config: Name %q is not [a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}", c.Name)
	case c.ShimPath == "":
		return errors.New("broker config: ShimPath is empty")
	case c.CandidateUID <= 0 || c.CandidateGID <= 0:
		return fmt.Errorf("broker config: candidate uid/gid %d/%d must not be root", c.CandidateUID, c.CandidateGID)
	case c.CodeUID < 0 || c.CodeGID < 0 || (c.CodeUID > 0 && (c.CodeUID == c.CandidateUID || c.CodeGID == 0 || c.CodeGID == c.CandidateGID)):
		// The candidate's group may write /tmp (closeScratch): the code
		// uid must not be in it.
		return fmt.Errorf("broker config: code uid/gid %d/%d must be another non-root identity, in another group than the candidate's", c.CodeUID, c.CodeGID)
	case c.CollectGrace < time.Second:
		return fmt.Errorf("broker config: CollectGrace %v is under 1s", c.CollectGrace)
	case c.EngineTimeout < time.Second:
		return fmt.Errorf("broker config: EngineTimeout %v is under 1s", c.EngineTimeout)
	case c.NProc < 64:
		return fmt.Errorf("broker config: NProc %d is under 64", c.NProc)
	case c.ImageTrees != ImageTreesAuto && c.ImageTrees != ImageTreesOn && c.ImageTrees != ImageTreesOff:
		return fmt.Errorf("broker config: ImageTrees %q is not %q, %q or %q (automatic)", c.ImageTrees, ImageTreesOn, ImageTreesOff, ImageTreesAuto)
	case !validVolumePrefix(c.VolumePrefix):
		return fmt.Errorf("broker config: VolumePrefix %q is not [a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}", c.VolumePrefix)
	case c.PoolSize < 0 || c.PoolSize > 64:
		return fmt.Errorf("broker config: PoolSize %d is not within 0..64", c.PoolSize)
	case c.PoolSize > 0 && c.PoolIdle < time.Second:
		return fmt.Errorf("broker config: PoolIdle %v is under 1s", c.PoolIdle)
	case c.NameBeat <= 0 || c.NameStale < 3*c.NameBeat:
		return fmt.Errorf("broker config: NameBeat %v must be positive and NameStale %v at least three of it", c.NameBeat, c.NameStale)
	}
	return nil
}

// volumePrefixRE, at most 64 bytes (validVolumePrefix): a counted
// repetition would compile into 63 copies of its class at every start.
var volumePrefixRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func validVolumePrefix(s string) bool { return len(s) <= 64 && volumePrefixRE.MatchString(s) }
