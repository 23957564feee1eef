package evaluate

import (
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Transitional: the free forms of Evaluation.CandidateJob and GraderJob, until
// cmd/sandboxd builds its jobs from the value too (removed in the next step).

func CandidateJob(m bundle.Manifest, bundleDigest, workspace, id, runtime string) sandbox.Job {
	return (&Evaluation{Manifest: m, BundleDigest: bundleDigest, Runtime: runtimeOr(runtime)}).CandidateJob(workspace, id)
}

func GraderJob(m bundle.Manifest, bundleDigest, layerDigest, export, id, runtime string) sandbox.Job {
	return (&Evaluation{Manifest: m, BundleDigest: bundleDigest, LayerDigest: layerDigest, Runtime: runtimeOr(runtime)}).GraderJob(export, id)
}
