package broker

import (
	"strings"
)

// Labels on every container and volume the broker creates.
const (
	LabelJob       = "sandboxd.job"        // job id (containers only)
	LabelJobDigest = "sandboxd.job.digest" // job digest (containers only)
	LabelDeadline  = "sandboxd.deadline"   // hard deadline, Unix milliseconds
	LabelBroker    = "sandboxd.broker"     // broker name
	LabelRole      = "sandboxd.role"       // job, populate, shim, input, tree
	LabelDigest    = "sandboxd.digest"     // content digest of a cached volume
	LabelNonce     = "sandboxd.nonce"      // random, set when a cache volume is created
	LabelSize      = "sandboxd.size"       // an input volume's content size in bytes (its tar's)
	LabelStream    = "sandboxd.stream"     // a job container's stream nonce (see shim.Hello)
	LabelVolume    = "sandboxd.volume"     // the volume a populate container mounts
)

// SelfcheckJobPrefix starts the id of every isolation selfcheck job
// (internal/selfcheck): jobs no journal holds, so that a daemon can tell
// the ones an earlier process of its name left.
const SelfcheckJobPrefix = "selfcheck-"

// Roles.
const (
	roleJob      = "job"
	rolePopulate = "populate"
	roleShim     = "shim"
	roleInput    = "input"
	roleTree     = "tree" // a directory of an image (trees.go)
)

// ContainerName is the deterministic name of a job's container, so that a
// retried create conflicts instead of running the job twice. The broker's
// name is part of it: brokers sharing an engine never collide.
func ContainerName(brokerName, jobID, jobDigest string) string {
	return brokerName + "-" + jobID + "-" + shortDigest(jobDigest)
}

func shortDigest(d string) string {
	hex := strings.TrimPrefix(d, "sha256:")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return hex
}

func (b *Broker) inputVolumeName(digest string) string {
	return b.cfg.VolumePrefix + "-input-" + strings.TrimPrefix(digest, "sha256:")
}

func (b *Broker) shimVolumeName(digest string) string {
	return b.cfg.VolumePrefix + "-shim-" + strings.TrimPrefix(digest, "sha256:")
}
