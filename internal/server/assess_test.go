package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The assess endpoint judges under the policy of the bundle the grader
// job ran, proven by digests, never under one the caller picks.
func TestAssessPolicyComesFromTheJobsBundle(t *testing.T) {
	b, err := bundle.Pack(context.Background(), "../bundle/testdata/example-bundle", t.TempDir(), bundle.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	blob := func(d string) []byte {
		data, err := os.ReadFile(filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	manifest, config := blob(b.Digest), blob(b.ConfigDigest)
	job := sandbox.Job{ID: "g", Bundle: b.Digest, Image: b.Manifest.Image}

	p, err := bundlePolicy(job, manifest, config)
	if err != nil {
		t.Fatalf("the job's own bundle: %v", err)
	}
	if string(p.Format) != b.Manifest.Report.Format || p.ReportPath != b.Manifest.Report.Path {
		t.Fatalf("policy %+v does not come from bundle.json", p)
	}

	lax := []byte(strings.Replace(string(config), `"required_checks"`, `"required_checkz"`, 1))
	otherImage := job
	otherImage.Image = "sha256:" + strings.Repeat("0", 64)
	noBundle := job
	noBundle.Bundle = ""
	for _, tc := range []struct {
		name             string
		job              sandbox.Job
		manifest, config []byte
		want             string
	}{
		{"no bundle on the job", noBundle, manifest, config, "names no bundle"},
		{"another manifest", job, append(manifest, ' '), config, "bundle_manifest hashes to"},
		{"another bundle.json", job, manifest, lax, "bundle_config hashes to"},
		{"another image", otherImage, manifest, config, "names image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bundlePolicy(tc.job, tc.manifest, tc.config)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("got %v, want an invalid-input error containing %q", err, tc.want)
			}
		})
	}
}
