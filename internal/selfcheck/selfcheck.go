package selfcheck

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/filedigest"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/selfcheck/probe"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// ErrFailed marks a self-check in which some isolation property did not
// hold; the error text names them.
var ErrFailed = errors.New("isolation self-check failed")

// ReportSchema is the version of Report this package writes.
const ReportSchema = "sandboxd.selfcheck/v1"

// Engine is what selfcheck asks the engine directly: its version, for the
// cache key.
type Engine interface {
	ServerVersion(ctx context.Context, options client.ServerVersionOptions) (client.ServerVersionResult, error)
}

// Options configure a self-check.
type Options struct {
	// Broker runs the probe job, exactly as it runs candidate jobs.
	Broker *broker.Broker
	// Blobs is the broker's blob store (the probe's input goes there).
	Blobs *store.Store
	// Engine is the broker's engine.
	Engine Engine
	// Image is the evaluator image (a local ID) the probe runs in; it needs
	// /bin/sleep and /bin/true only for bombs, not for the check.
	Image string
	// Runtime is the runtime the probe runs under, as the jobs it vouches
	// for do ("" is sandbox.RuntimeRunc).
	Runtime string
	// Probe is the static sandboxd-probe binary, known by its digest (part
	// of the cache's key) and read only when a check runs.
	Probe filedigest.File
	// CandidateUID and CandidateGID are the broker's candidate ids.
	CandidateUID, CandidateGID int
	// StateDir holds the cache of passing checks ("" disables the cache).
	StateDir string
}

// Key is everything a check's answer depends on.
type Key struct {
	EngineVersion string `json:"engine_version"`
	EngineAPI     string `json:"engine_api"`
	// KernelVersion is the engine's kernel: Docker's answer, or, for
	// containerd (which runs on this host and says nothing of its kernel),
	// this host's release and build.
	KernelVersion string `json:"kernel_version"`
	// Components are the versions of the engine's parts it reports
	// (Docker's containerd, runc and docker-init), "name version" each.
	Components string `json:"components,omitempty"`
	// BootID is this host's boot: a reboot, which can bring another
	// kernel, other boot options (ia32_emulation=, lsm=, …) or another
	// runtime binary under the same versions, checks again.
	BootID        string `json:"boot_id"`
	ProfileDigest string `json:"profile_digest"`
	Image         string `json:"image"`
	Runtime       string `json:"runtime"`
	ProbeDigest   string `json:"probe_digest"`
	ShimDigest    string `json:"shim_digest"`
	BrokerVersion string `json:"broker_version"`
	// Unknown names the engine's parts it could not identify (a binary
	// it could not find or read): no pass is kept for such a key, since
	// nothing in it would tell one of them replaced.
	Unknown string `json:"unknown,omitempty"`
}

func (k Key) digest() string {
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Report is the outcome of one self-check.
type Report struct {
	Schema     string         `json:"schema"`
	Key        Key            `json:"key"`
	CheckedAt  time.Time      `json:"checked_at"`
	OK         bool           `json:"ok"`
	Cached     bool           `json:"cached"`
	Properties []Property     `json:"properties"`
	Result     sandbox.Result `json:"result"`
	Probe      probe.Report   `json:"probe"`
}

// Failed returns the properties that did not hold.
func (r *Report) Failed() []Property { return Failed(r.Properties) }

// Err returns nil if every property held, else an ErrFailed naming them.
func (r *Report) Err() error {
	f := r.Failed()
	if len(f) == 0 && r.OK {
		return nil
	}
	names := make([]string, 0, len(f))
	for _, p := range f {
		names = append(names, p.Name)
	}
	return fmt.Errorf("%w: %s", ErrFailed, strings.Join(names, ", "))
}

// Ensure returns the cached pass for this engine, profile, image, probe and
// helper, or runs the check. The error is ErrFailed (naming the failed
// properties) when isolation does not hold, another error when the check
// could not run; either way nothing may proceed.
func Ensure(ctx context.Context, o Options) (*Report, error) {
	key, err := o.key(ctx)
	if err != nil {
		return nil, err
	}
	if r, ok := o.cached(key); ok {
		return r, nil
	}
	r, err := o.run(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := r.Err(); err != nil {
		return r, err
	}
	if err := o.store(r); err != nil {
		return r, fmt.Errorf("selfcheck: cache the pass: %w", err)
	}
	return r, nil
}

// Recheck always runs the check, and its outcome replaces what the cache
// holds for its key: a pass is stored; a failure, or a check that could
// not run, removes the cached pass, so that no later process runs jobs on
// a pass this check did not confirm.
func Recheck(ctx context.Context, o Options) (*Report, error) {
	key, err := o.key(ctx)
	if err != nil {
		return nil, err
	}
	r, err := o.run(ctx, key)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		if ferr := o.forget(key); ferr != nil {
			return r, fmt.Errorf("%w; and the cached pass could not be removed (later processes would run jobs on it: remove %s): %v", err, o.cachePath(key), ferr)
		}
		return r, err
	}
	if err := o.store(r); err != nil {
		return r, fmt.Errorf("selfcheck: cache the pass: %w", err)
	}
	return r, nil
}

// forget removes the cached pass for k, if there is one.
func (o Options) forget(k Key) error {
	if o.StateDir == "" {
		return nil
	}
	if err := os.Remove(o.cachePath(k)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Run always runs the check, ignoring and not touching the cache.
func Run(ctx context.Context, o Options) (*Report, error) {
	key, err := o.key(ctx)
	if err != nil {
		return nil, err
	}
	return o.run(ctx, key)
}

func (o Options) validate() error {
	switch {
	case o.Broker == nil || o.Blobs == nil || o.Engine == nil:
		return errors.New("selfcheck: broker, blob store and engine are required")
	case !sandbox.ValidDigest(o.Image):
		return fmt.Errorf("selfcheck: image %q is not a local image ID", o.Image)
	case o.Probe.Path == "" || !sandbox.ValidDigest(o.Probe.Digest):
		return errors.New("selfcheck: no probe binary")
	case o.CandidateUID <= 0 || o.CandidateGID <= 0:
		return fmt.Errorf("selfcheck: candidate ids %d/%d must not be root", o.CandidateUID, o.CandidateGID)
	}
	return nil
}

func (o Options) runtime() string {
	if o.Runtime == "" {
		return sandbox.RuntimeRunc
	}
	return o.Runtime
}

func (o Options) key(ctx context.Context) (Key, error) {
	if err := o.validate(); err != nil {
		return Key{}, err
	}
	facts, err := o.Broker.Facts(ctx)
	if err != nil {
		return Key{}, fmt.Errorf("selfcheck: %w", err)
	}
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := o.Engine.ServerVersion(vctx, client.ServerVersionOptions{})
	if err != nil {
		return Key{}, fmt.Errorf("selfcheck: engine version: %w", err)
	}
	host, err := hostOf(v)
	if err != nil {
		return Key{}, fmt.Errorf("selfcheck: %w", err)
	}
	return Key{
		EngineVersion: facts.EngineVersion,
		EngineAPI:     facts.EngineAPI,
		KernelVersion: host.KernelVersion,
		Components:    host.Components,
		Unknown:       host.Unknown,
		BootID:        host.BootID,
		ProfileDigest: seccomp.Digest(),
		Image:         o.Image,
		Runtime:       o.runtime(),
		ProbeDigest:   o.Probe.Digest,
		ShimDigest:    facts.ShimDigest,
		BrokerVersion: facts.BrokerVersion,
	}, nil
}

// Where this host's kernel says which boot, release and build it is.
var (
	bootIDPath    = "/proc/sys/kernel/random/boot_id"
	osReleasePath = "/proc/sys/kernel/osrelease"
	osVersionPath = "/proc/sys/kernel/version"
)

// hostOf returns the part of a check's key that is the engine's host
// rather than the engine: its kernel, the versions of the engine's parts,
// and this host's boot (the host sandboxd runs on: an engine elsewhere,
// DOCKER_HOST, reboots unseen). A boot that cannot be read is an error:
// no check is run or answered.
func hostOf(v client.ServerVersionResult) (Key, error) {
	var k Key
	var parts, unknown []string
	for _, c := range v.Components {
		if u := c.Details["Unknown"]; u != "" {
			unknown = append(unknown, c.Name+": "+u)
		}
		if kv, ok := c.Details["KernelVersion"]; ok && k.KernelVersion == "" {
			k.KernelVersion = kv
		}
		part := c.Name + " " + c.Version
		if commit := c.Details["GitCommit"]; commit != "" {
			// A distribution's rebuild (1.1.5+ds1-1+deb12u1) keeps
			// the version and changes this.
			part += " (" + commit + ")"
		}
		parts = append(parts, part)
	}
	slices.Sort(parts)
	k.Components = strings.Join(parts, ", ")
	slices.Sort(unknown)
	k.Unknown = strings.Join(unknown, "; ")
	boot, err := readProc(bootIDPath)
	if err != nil {
		return Key{}, fmt.Errorf("this host's boot: %w", err)
	}
	k.BootID = boot
	if k.KernelVersion == "" {
		release, err := readProc(osReleasePath)
		if err != nil {
			return Key{}, fmt.Errorf("this host's kernel: %w", err)
		}
		build, err := readProc(osVersionPath)
		if err != nil {
			return Key{}, fmt.Errorf("this host's kernel: %w", err)
		}
		k.KernelVersion = release + " " + build
	}
	return k, nil
}

// readProc returns a one-line file of /proc, which must not be empty.
func readProc(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

func (o Options) cachePath(k Key) string {
	return filepath.Join(o.StateDir, "selfcheck", k.digest()+".json")
}

func (o Options) cached(k Key) (*Report, bool) {
	if o.StateDir == "" || k.Unknown != "" {
		return nil, false
	}
	b, err := os.ReadFile(o.cachePath(k))
	if err != nil {
		return nil, false
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil || r.Schema != ReportSchema || r.Key != k || r.Err() != nil {
		return nil, false
	}
	r.Cached = true
	return &r, true
}

func (o Options) store(r *Report) error {
	if o.StateDir == "" || r.Key.Unknown != "" {
		return nil
	}
	p := o.cachePath(r.Key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return err
	}
	pruneOtherBoots(filepath.Dir(p), r.Key.BootID)
	return nil
}

// pruneOtherBoots removes the cached passes of dir kept under another boot
// than boot: no key of this boot names them, so they would only pile up,
// one set per reboot. A file it cannot read or parse is left as it is
// (cached never answers with one).
func pruneOtherBoots(dir, boot string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var old struct {
			Key struct {
				BootID *string `json:"boot_id"`
			} `json:"key"`
		}
		if json.Unmarshal(b, &old) == nil && old.Key.BootID != nil && *old.Key.BootID != boot {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Paths inside the self-check sandbox.
const (
	probeDir  = sandbox.InputsPath + "/probe"
	probeFile = probeDir + "/sandboxd-probe"
	// resolveName is looked up inside the sandbox, whose only resolver is
	// 127.0.0.1 there: the query never leaves the sandbox's loopback.
	resolveName = "sandboxd-selfcheck.invalid"
	reportDir   = sandbox.WorkPath + "/out"
	reportFile  = reportDir + "/probe.json"
)

func (o Options) run(ctx context.Context, key Key) (*Report, error) {
	probeBin, err := o.Probe.Read()
	if err != nil {
		return nil, fmt.Errorf("selfcheck: probe: %w", err)
	}
	probeTar, err := tarOf(map[string][]byte{"sandboxd-probe": probeBin}, 0o755)
	if err != nil {
		return nil, err
	}
	bundleTar, err := tarOf(map[string][]byte{"bundle.json": []byte("{}\n")}, 0o644)
	if err != nil {
		return nil, err
	}
	probeDigest, err := o.Blobs.PutBytes(probeTar)
	if err != nil {
		return nil, fmt.Errorf("selfcheck: store probe: %w", err)
	}
	bundleDigest, err := o.Blobs.PutBytes(bundleTar)
	if err != nil {
		return nil, fmt.Errorf("selfcheck: store bundle: %w", err)
	}

	// A listener on the host's loopback: the sandbox must not reach it, and
	// the host, not the probe, is the witness.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("selfcheck: host listener: %w", err)
	}
	accepted := make(chan string, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c.RemoteAddr().String():
			default:
			}
			c.Close()
		}
	}()
	defer ln.Close()

	env := map[string]string{"SANDBOXD_SELFCHECK": "1"}
	job := sandbox.Job{
		Schema: sandbox.JobSchema, ID: broker.SelfcheckJobPrefix + randHex(6), Image: o.Image,
		Inputs: []sandbox.Input{
			{Name: "probe", Digest: probeDigest, Path: probeDir},
			{Name: "bundle", Digest: bundleDigest, Path: sandbox.BundlePath},
		},
		Argv: []string{probeFile, "report", "-o", reportFile,
			"-connect", ln.Addr().String(), "-resolve", resolveName,
			"-readonly", sandbox.BundlePath, "-readonly", probeDir},
		Env: env, WorkDir: sandbox.WorkPath, Outputs: []string{reportDir},
		Limits: checkLimits(), Network: sandbox.NetworkNone, Runtime: o.runtime(),
	}
	if err := job.Seal(); err != nil {
		return nil, fmt.Errorf("selfcheck: %w", err)
	}
	res, err := o.Broker.Run(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("selfcheck: run probe: %w", err)
	}
	r := &Report{Schema: ReportSchema, Key: key, CheckedAt: time.Now().UTC(), Result: res}
	add := func(name string, ok bool, detail string) {
		r.Properties = append(r.Properties, Property{Name: name, OK: ok, Detail: detail})
	}
	add("probe-job", res.Status == sandbox.StatusSucceeded && res.ExitCode == 0,
		fmt.Sprintf("status %s exit %d %s", res.Status, res.ExitCode, res.Cause))
	add("seccomp-profile", res.Security.SeccompDigest == key.ProfileDigest && res.Runtime.SeccompDigest == key.ProfileDigest,
		fmt.Sprintf("result records %s / %s, want %s", res.Security.SeccompDigest, res.Runtime.SeccompDigest, key.ProfileDigest))
	add("engine-version", res.Runtime.EngineVersion == key.EngineVersion,
		fmt.Sprintf("result records %q, want %q", res.Runtime.EngineVersion, key.EngineVersion))

	var rep probe.Report
	out, err := o.readArtifact(res, reportFile)
	if err == nil {
		err = json.Unmarshal(out, &rep)
	}
	add("probe-report", err == nil, fmt.Sprintf("decode the probe's report artifact: %v", err))
	r.Probe = rep
	want := map[string]string{"HOME": sandbox.WorkPath, "HOSTNAME": "sandbox"}
	for k, v := range env {
		want[k] = v
	}
	r.Properties = append(r.Properties, Properties(rep, Expect{
		CandidateUID: o.CandidateUID, CandidateGID: o.CandidateGID,
		Env: want, Hostname: "sandbox", Connect: true, Resolve: true,
		ReadOnly: []string{sandbox.BundlePath, probeDir},
		Volumes:  []string{broker.ShimDir, sandbox.BundlePath, probeDir},
		Runtime:  o.runtime(),
	})...)
	ln.Close()
	select {
	case from := <-accepted:
		add("host-listener-untouched", false, "the host loopback listener accepted a connection from "+from)
	default:
		add("host-listener-untouched", true, "no connection reached the host loopback listener")
	}
	r.OK = len(r.Failed()) == 0
	return r, nil
}

// readArtifact reads a collected artifact from the blob store: like a
// grader's report, the probe's report is an artifact, never read from its
// logs.
func (o Options) readArtifact(res sandbox.Result, path string) ([]byte, error) {
	a, ok := res.Artifact(path)
	if !ok {
		return nil, fmt.Errorf("no artifact %s", path)
	}
	f, err := o.Blobs.Open(a.Digest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(f)
	return b.Bytes(), err
}

func checkLimits() sandbox.Limits {
	l := sandbox.DefaultLimits()
	l.WallTimeMS = 60_000
	l.MemoryBytes = 128 << 20
	l.Pids = 64
	l.DiskBytes = 8 << 20
	l.OutputBytes = 1 << 20
	l.LogBytes = 1 << 20
	l.FileCount = 16
	return l
}

// tarOf builds a tar of regular files with the given mode.
func tarOf(files map[string][]byte, mode int64) ([]byte, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: mode, Typeflag: tar.TypeReg, Size: int64(len(files[n])), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
