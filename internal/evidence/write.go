package evidence

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Write writes the evidence directory of an evaluation's outcome next to
// dir and renames it into place, so that dir is either absent or complete.
// ws is the candidate's workspace digest; blobs hold the jobs' logs and
// artifacts. An empty directory at dir is replaced.
func Write(dir string, blobs *store.Store, signer *receipt.Signer, b *bundle.Bundle, ws string, o *evaluate.Outcome) error {
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	w := &evidenceWriter{root: tmp, blobs: blobs, idx: Index{
		Schema: Schema, Verdict: string(o.Assessment.Verdict), BundleDigest: b.Digest,
		Image: b.Manifest.Image, WorkspaceDigest: ws, BrokerKey: "broker.pub", BrokerKeyID: signer.KeyID(),
		EphemeralKey: signer.Ephemeral(), Assessment: "assessment.json", Controls: []Control{},
		Artifacts: map[string]string{},
	}}
	w.file("broker.pub", signer.PublicKeyPEM())
	w.file("assessment.json", o.AssessmentJSON)
	if o.Statement != nil {
		w.idx.Statement = "test-result.intoto.json"
		w.file(w.idx.Statement, o.Statement)
	}
	for _, c := range o.Controls {
		name := "control-" + string(c.Kind) + ".assessment.json"
		w.file(name, c.AssessmentJSON)
		w.idx.Controls = append(w.idx.Controls, Control{Kind: string(c.Kind), Verdict: string(c.Assessment.Verdict), Assessment: name})
	}
	for _, j := range o.Jobs {
		canon, err := j.Job.CanonicalJSON()
		if err != nil {
			return err
		}
		ej := Job{
			Role: j.Role, ID: j.Job.ID, Digest: j.Job.Digest, Status: string(j.Result.Status),
			Job: "jobs/" + j.Job.ID + ".json", Receipt: j.Job.ID + ".receipt.intoto.json", Result: j.Job.ID + ".result.intoto.json",
		}
		w.file(ej.Job, canon)
		w.file(ej.Receipt, j.Receipt)
		w.file(ej.Result, j.ResultEnvelope)
		ej.Stdout = w.blob("logs/"+j.Job.ID+".stdout", j.Result.Stdout.Digest)
		ej.Stderr = w.blob("logs/"+j.Job.ID+".stderr", j.Result.Stderr.Digest)
		for _, a := range j.Result.Artifacts {
			w.idx.Artifacts[a.Digest] = w.blob(artifactFile(a.Digest), a.Digest)
		}
		w.idx.Jobs = append(w.idx.Jobs, ej)
	}
	idx, err := marshalIndent(w.idx)
	if err != nil {
		return err
	}
	w.file("index.json", idx)
	if w.err != nil {
		return w.err
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	os.Remove(dir) // an empty directory given as --out
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("move evidence into %s: %w", dir, err)
	}
	return nil
}

type evidenceWriter struct {
	root  string
	blobs *store.Store
	idx   Index
	err   error
}

func (w *evidenceWriter) file(name string, data []byte) {
	if w.err != nil {
		return
	}
	p := filepath.Join(w.root, name)
	if w.err = os.MkdirAll(filepath.Dir(p), 0o755); w.err == nil {
		w.err = os.WriteFile(p, data, 0o644)
	}
}

// blob copies a blob into the directory and returns its name there ("" for
// an absent digest).
func (w *evidenceWriter) blob(name, digest string) string {
	if w.err != nil || digest == "" {
		return ""
	}
	f, err := w.blobs.Open(digest)
	if err != nil {
		w.err = err
		return ""
	}
	defer f.Close()
	p := filepath.Join(w.root, name)
	if w.err = os.MkdirAll(filepath.Dir(p), 0o755); w.err != nil {
		return ""
	}
	out, err := os.Create(p)
	if err != nil {
		w.err = err
		return ""
	}
	if _, err := io.Copy(out, f); err != nil {
		w.err = err
	}
	if err := out.Close(); err != nil && w.err == nil {
		w.err = err
	}
	return name
}

func syncTree(root string) error {
	return filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}
