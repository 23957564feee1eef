package sandbox

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// ExportPath is the directory a candidate job leaves what the grader should
// see in: its regular files, re-rooted, become the grader's
// CandidateExportPath.
const ExportPath = "/work/export"

// CandidateExportInput is the name of the grader job's input that carries
// the candidate's export.
const CandidateExportInput = "candidate-export"

// OpenArtifact returns the content of one collected artifact, e.g. from
// (*client.Client).Blob. WriteCandidateExport checks it against the
// artifact's digest and size.
type OpenArtifact func(Artifact) (io.ReadCloser, error)

// WriteCandidateExport writes the candidate's export to w in the canonical
// tar form (WriteTree) and returns its digest: every artifact of res
// collected below ExportPath, re-rooted there, mode 0644. Artifacts
// elsewhere are not part of it. It is the export the daemon rebuilds from
// the same result when it assesses; the bytes must reach the daemon as a
// blob (PutBlob) before the grader job that names them is submitted.
func WriteCandidateExport(w io.Writer, res Result, open OpenArtifact) (string, error) {
	var entries []TreeEntry
	for _, a := range res.Artifacts {
		rel, ok := strings.CutPrefix(a.Path, ExportPath+"/")
		if !ok {
			continue
		}
		entries = append(entries, TreeEntry{
			Name: rel, Size: a.Size, Digest: a.Digest,
			Open: func() (io.ReadCloser, error) { return open(a) },
		})
	}
	d, err := WriteTree(w, entries)
	if err != nil {
		return "", fmt.Errorf("candidate export of job %s: %w", res.JobID, err)
	}
	return d, nil
}

// GraderJob is the grader job the daemon accepts for a candidate: the
// sealed grader template of the plan with the candidate's export appended
// as a read-only input at CandidateExportPath, sealed again. candidateJob
// is the plan's candidate job; candidate must be its verified result (see
// Authenticity.VerifyResult) and export the digest WriteCandidateExport
// returned for it. The template must be sealed, of the candidate job's
// bundle and image, and must not already have an input named
// CandidateExportInput or at CandidateExportPath.
func GraderJob(template, candidateJob Job, candidate Result, export string) (Job, error) {
	if err := template.VerifyDigest(); err != nil {
		return Job{}, fmt.Errorf("grader template: %w", err)
	}
	if err := candidateJob.VerifyDigest(); err != nil {
		return Job{}, fmt.Errorf("candidate job: %w", err)
	}
	if candidate.JobID != candidateJob.ID || candidate.JobDigest != candidateJob.Digest {
		return Job{}, fmt.Errorf("grader job: %w: the result is of job %s (%s), not the candidate job %s (%s)", ErrInvalid, candidate.JobID, candidate.JobDigest, candidateJob.ID, candidateJob.Digest)
	}
	if template.Bundle != candidateJob.Bundle || template.Image != candidateJob.Image {
		return Job{}, fmt.Errorf("grader job: %w: the template runs bundle %s on image %s, the candidate job bundle %s on image %s", ErrInvalid, template.Bundle, template.Image, candidateJob.Bundle, candidateJob.Image)
	}
	if !ValidDigest(export) {
		return Job{}, fmt.Errorf("grader job: %w: malformed export digest %q", ErrInvalid, export)
	}
	for _, in := range template.Inputs {
		if in.Name == CandidateExportInput || under(in.Path, CandidateExportPath) || under(CandidateExportPath, in.Path) {
			return Job{}, fmt.Errorf("grader template: %w: input %q at %s already takes the candidate export's place", ErrInvalid, in.Name, in.Path)
		}
	}
	g := template
	g.Digest = ""
	g.Inputs = append(slices.Clone(template.Inputs), Input{Name: CandidateExportInput, Digest: export, Path: CandidateExportPath})
	g.Argv = slices.Clone(template.Argv)
	g.Outputs = slices.Clone(template.Outputs)
	env := make(map[string]string, len(template.Env))
	for k, v := range template.Env {
		env[k] = v
	}
	g.Env = env
	if err := g.Seal(); err != nil {
		return Job{}, fmt.Errorf("grader job: %w", err)
	}
	return g, nil
}
