package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/sandbox"
)

const bundleUsage = `usage: sandboxd bundle pack DIR [-o LAYOUT] [--quiet]
       sandboxd bundle inspect [--json] REF
       sandboxd bundle verify REF

pack     packs the bundle tree at DIR (bundle.json plus files) into the OCI
         image layout LAYOUT (default DIR.oci); prints the bundle digest last
inspect  shows a bundle's digests and bundle.json
verify   re-hashes every blob of a bundle; exits 0 only if it verifies

REF is an OCI image layout directory, or LAYOUT@sha256:<hex> to pick one
bundle of a layout that holds several.
`

type bundlePackOptions struct {
	dir    string
	layout string
	quiet  bool
}

// cmdBundle packs, inspects and verifies evaluator bundles.
func cmdBundle(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) {
		io.WriteString(stderr, bundleUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "pack":
		return bundlePack(ctx, args[1:], stdout, stderr)
	case "inspect", "verify":
		fset := flag.NewFlagSet("bundle "+args[0], flag.ContinueOnError)
		fset.SetOutput(stderr)
		fset.Usage = func() { io.WriteString(stderr, bundleUsage) }
		asJSON := new(bool)
		if args[0] == "inspect" {
			fset.BoolVar(asJSON, "json", false, "print the bundle as one line of JSON (docs/schema/bundle-inspect.json)")
		}
		pos, code := parseInterleaved(fset, args[1:])
		if code >= 0 {
			return code
		}
		if len(pos) != 1 {
			fset.Usage()
			return exitUsage
		}
		if args[0] == "inspect" {
			return bundleInspect(pos[0], *asJSON, stdout, stderr)
		}
		return bundleVerify(ctx, pos[0], stdout, stderr)
	}
	fmt.Fprintf(stderr, "sandboxd: bundle: unknown subcommand %q\n", args[0])
	io.WriteString(stderr, bundleUsage)
	return exitUsage
}

func bundlePack(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o bundlePackOptions
	fset := flag.NewFlagSet("bundle pack", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.StringVar(&o.layout, "o", "", "write the OCI image layout to `LAYOUT` (default DIR.oci)")
	fset.BoolVar(&o.quiet, "quiet", false, "print no progress on stderr")
	fset.Usage = func() { io.WriteString(stderr, bundleUsage) }
	pos, code := parseInterleaved(fset, args)
	if code >= 0 {
		return code
	}
	if len(pos) != 1 {
		fset.Usage()
		return exitUsage
	}
	o.dir = pos[0]
	if o.layout == "" {
		o.layout = filepath.Clean(o.dir) + ".oci"
	}
	step := progress.Start(newReporter(stderr, o.quiet), "packing bundle "+o.dir)
	b, err := bundle.PackProgress(ctx, o.dir, o.layout, bundle.DefaultLimits(), func(n int64) { step.Update("writing layer", n, -1) })
	endStep(step, err)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: bundle pack: %v\n", err)
		return exitForInput(err)
	}
	fmt.Fprintf(stdout, "layout: %s\nconfig: %s\nlayer:  %s (%d bytes)\n%s\n", b.Layout, b.ConfigDigest, b.LayerDigest, b.LayerSize, b.Digest)
	return exitOK
}

func bundleInspect(ref string, asJSON bool, stdout, stderr io.Writer) int {
	b, err := bundle.Open(ref, bundle.DefaultLimits())
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: bundle inspect: %v\n", err)
		return exitForInput(err)
	}
	if asJSON {
		return printJSON(stdout, stderr, struct {
			Bundle    string          `json:"bundle"`
			Layout    string          `json:"layout"`
			Config    string          `json:"config"`
			Layer     string          `json:"layer"`
			LayerSize int64           `json:"layer_size"`
			Manifest  bundle.Manifest `json:"manifest"`
		}{b.Digest, b.Layout, b.ConfigDigest, b.LayerDigest, b.LayerSize, b.Manifest})
	}
	m, err := json.MarshalIndent(b.Manifest, "", "  ")
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: bundle inspect: %v\n", err)
		return exitInfraError
	}
	fmt.Fprintf(stdout, "bundle: %s\nlayout: %s\nconfig: %s\nlayer:  %s (%d bytes)\nbundle.json:\n%s\n",
		b.Digest, b.Layout, b.ConfigDigest, b.LayerDigest, b.LayerSize, m)
	return exitOK
}

func bundleVerify(ctx context.Context, ref string, stdout, stderr io.Writer) int {
	b, err := bundle.Open(ref, bundle.DefaultLimits())
	if err == nil {
		err = b.Verify(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: bundle verify: %v\n", err)
		if errors.Is(err, bundle.ErrDigestMismatch) || errors.Is(err, bundle.ErrNotCanonical) {
			return exitFailed
		}
		return exitForInput(err)
	}
	fmt.Fprintf(stdout, "verified %s\n", b.Digest)
	return exitOK
}

// exitForInput maps an error to bad input (refused, missing) or an
// infrastructure failure.
func exitForInput(err error) int {
	if errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, fs.ErrNotExist) {
		return exitBadInput
	}
	return exitInfraError
}

// parseInterleaved parses flags that may follow positional arguments
// ("pack DIR -o LAYOUT"). It returns the positionals and -1, or an exit code.
func parseInterleaved(fset *flag.FlagSet, args []string) ([]string, int) {
	var pos []string
	for {
		if code := parseFlags(fset, args); code >= 0 {
			return nil, code
		}
		args = fset.Args()
		if len(args) == 0 {
			return pos, -1
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), -1
		}
		if strings.HasPrefix(args[0], "-") && args[0] != "-" {
			continue
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
