package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/filedigest"
	"io"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/selfcheck"
	"github.com/sandboxd/sandboxd/internal/store"
)

// cmdSelfcheck proves the isolation properties on this engine: it runs the
// probe in a sandbox of images/minimal and exits 0 only if every property
// holds (exitFailed naming the failed ones otherwise).
func cmdSelfcheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("selfcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	imageDir := fs.String("image", "images/minimal", "images/<name> directory of the image to check in")
	force := fs.Bool("force", false, "check again whatever is cached; the outcome replaces the cached one (a failure removes a cached pass: no later process runs jobs on it)")
	asJSON := fs.Bool("json", false, "print the full report as JSON")
	eo := addEngineFlags(fs)
	rt := addRuntimeFlag(fs, "runtime to check: runc or runsc (each is checked on its own)")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: sandboxd selfcheck [--engine docker|containerd] [--runtime runc|runsc] [--image DIR] [--force] [--json]")
		return exitUsage
	}
	s, err := openOneShot(ctx, eo, rt.runsc())
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd selfcheck:", err)
		return exitInfraError
	}
	defer s.Close()
	img, err := image.Build(ctx, s.docker, *imageDir, "", nil)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd selfcheck:", err)
		return exitInfraError
	}
	r, err := runSelfcheck(ctx, s.engine, s.broker, s.blobs, s.state, img.ID, string(*rt), *force)
	if r != nil {
		printSelfcheck(stdout, r, *asJSON)
	}
	switch {
	case errors.Is(err, selfcheck.ErrFailed):
		fmt.Fprintln(stderr, "sandboxd selfcheck:", err)
		return exitFailed
	case err != nil:
		fmt.Fprintln(stderr, "sandboxd selfcheck:", err)
		return exitInfraError
	}
	return exitOK
}

// selfcheckGate is the gate `serve`, `run` and `exec` put before their
// jobs: one check per engine, image and runtime for the life of the
// process, each the cached pass of runSelfcheck or a fresh check.
func selfcheckGate(eng selfcheck.Engine, b *broker.Broker, blobs *store.Store, state string) *selfcheck.Gate {
	return selfcheck.NewGate(func(ctx context.Context, k selfcheck.GateKey) error {
		_, err := runSelfcheck(ctx, eng, b, blobs, state, k.Image, k.Runtime, false)
		return err
	})
}

// runSelfcheck is what the gate runs: the cached pass for this engine,
// profile, image, runtime, probe and helper, or a fresh check. A non-nil
// error means no job may run.
func runSelfcheck(ctx context.Context, eng selfcheck.Engine, b *broker.Broker, blobs *store.Store, state, imageID, runtime string, force bool) (*selfcheck.Report, error) {
	probe, err := probeBinary(state)
	if err != nil {
		return nil, err
	}
	cfg := broker.Default()
	o := selfcheck.Options{
		Broker: b, Blobs: blobs, Engine: eng, Image: imageID, Runtime: runtime, Probe: probe,
		CandidateUID: cfg.CandidateUID, CandidateGID: cfg.CandidateGID, StateDir: state,
	}
	if force {
		r, err := selfcheck.Recheck(ctx, o)
		if err != nil && !errors.Is(err, selfcheck.ErrFailed) {
			return nil, err
		}
		return r, err
	}
	return selfcheck.Ensure(ctx, o)
}

// probeBinary is the static probe, $SANDBOXD_PROBE or sandboxd-probe next
// to this executable, known by its digest (remembered in the state
// directory's digests).
func probeBinary(state string) (filedigest.File, error) {
	p := os.Getenv("SANDBOXD_PROBE")
	if p == "" {
		exe, err := os.Executable()
		if err != nil {
			return filedigest.File{}, err
		}
		p = filepath.Join(filepath.Dir(exe), "sandboxd-probe")
	}
	f, err := filedigest.Open(p, digestMemo(state))
	if err != nil {
		return filedigest.File{}, fmt.Errorf("read the probe (build it with CGO_ENABLED=0 go build -o DIR/sandboxd-probe ./cmd/sandboxd-probe next to sandboxd, or set SANDBOXD_PROBE): %w", err)
	}
	return f, nil
}

func printSelfcheck(w io.Writer, r *selfcheck.Report, asJSON bool) {
	if asJSON {
		b, _ := json.MarshalIndent(r, "", "  ")
		fmt.Fprintln(w, string(b))
		return
	}
	held := 0
	for _, p := range r.Properties {
		if p.OK {
			held++
			continue
		}
		fmt.Fprintf(w, "FAIL %s: %s\n", p.Name, p.Detail)
	}
	src := "checked now"
	if r.Key.Unknown != "" {
		src = "checked now, not kept: the engine's parts are not all known (" + r.Key.Unknown + ")"
	}
	if r.Cached {
		src = "cached from " + r.CheckedAt.Format("2006-01-02T15:04:05Z")
	}
	fmt.Fprintf(w, "%d/%d isolation properties hold (engine %s, kernel %s, profile %s; %s)\n",
		held, len(r.Properties), r.Key.EngineVersion, r.Key.KernelVersion, r.Key.ProfileDigest, src)
}
