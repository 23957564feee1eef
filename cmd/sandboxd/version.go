package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/sandboxd/sandboxd/internal/filedigest"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
)

// version and commit are set at link time (scripts/setup passes
// -X main.commit=…); without them the commit comes from the build's VCS
// stamp.
var (
	version = "0.1.0-dev"
	commit  = ""
)

// versionInfo is what `sandboxd version --json` prints
// (docs/schema/version.json).
type versionInfo struct {
	Version string `json:"version"`
	// Commit is the source revision ("unknown" when the build has none);
	// Modified says the tree had uncommitted changes.
	Commit   string `json:"commit"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	// ShimDigest is the digest of the in-container helper this command
	// would use, the one receipts record as runtime.shim_digest ("" when
	// it is not found; ShimError says why).
	ShimDigest    string `json:"shim_digest"`
	ShimPath      string `json:"shim_path,omitempty"`
	ShimError     string `json:"shim_error,omitempty"`
	SeccompDigest string `json:"seccomp_digest"`
}

func currentVersion() versionInfo {
	v := versionInfo{Version: version, Commit: commit, Go: "unknown", SeccompDigest: seccomp.Digest()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Go = bi.GoVersion
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && v.Commit == "":
				v.Commit = s.Value
			case s.Key == "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	p, err := shimPath()
	if err == nil {
		var f filedigest.File
		if f, err = filedigest.Open(p, ""); err == nil {
			v.ShimDigest, v.ShimPath = f.Digest, p
		}
	}
	if err != nil {
		v.ShimError = err.Error()
	}
	return v
}

// cmdVersion prints the version, the commit and the helper's digest;
// `sandboxd --version` is the same.
func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the version as JSON")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: sandboxd version [--json]")
		return exitUsage
	}
	v := currentVersion()
	if *asJSON {
		return printJSON(stdout, stderr, v)
	}
	modified := ""
	if v.Modified {
		modified = " (modified)"
	}
	shim := v.ShimDigest
	if shim == "" {
		shim = "not found: " + v.ShimError
	}
	fmt.Fprintf(stdout, "sandboxd %s\ncommit:  %s%s\ngo:      %s\nhelper:  %s\nseccomp: %s\n", v.Version, v.Commit, modified, v.Go, shim, v.SeccompDigest)
	return exitOK
}

// printJSON writes v as one line of JSON, the form every --json output
// has (schemas in docs/schema).
func printJSON(stdout, stderr io.Writer, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd: json:", err)
		return exitInfraError
	}
	stdout.Write(append(b, '\n'))
	return exitOK
}
