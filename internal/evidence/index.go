package evidence

import (
	"encoding/json"
	"strings"
)

// Schema is index.json's schema.
const Schema = "sandboxd.evidence/v1"

// Index is index.json of an evidence directory: what is where. It is not
// signed: a reader checks every claim in it against signed or recomputed
// facts.
type Index struct {
	Schema          string            `json:"schema"`
	Verdict         string            `json:"verdict"`
	BundleDigest    string            `json:"bundle_digest"`
	Image           string            `json:"image"`
	WorkspaceDigest string            `json:"workspace_digest"`
	BrokerKey       string            `json:"broker_key"`
	BrokerKeyID     string            `json:"broker_key_id"`
	EphemeralKey    bool              `json:"ephemeral_key"`
	Assessment      string            `json:"assessment"`
	Statement       string            `json:"statement,omitempty"`
	Controls        []Control         `json:"controls"`
	Jobs            []Job             `json:"jobs"`
	Artifacts       map[string]string `json:"artifacts"` // digest → file
}

// Job is one job's files.
type Job struct {
	Role    string `json:"role"`
	ID      string `json:"id"`
	Digest  string `json:"digest"`
	Status  string `json:"status"`
	Job     string `json:"job"`
	Receipt string `json:"receipt"`
	Result  string `json:"result"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
}

// Control is one control's assessment file.
type Control struct {
	Kind       string `json:"kind"`
	Verdict    string `json:"verdict"`
	Assessment string `json:"assessment"`
}

// artifactFile is where an artifact is filed.
func artifactFile(digest string) string {
	return "artifacts/" + strings.TrimPrefix(digest, "sha256:")
}

// marshalIndent is json.MarshalIndent without HTML escaping.
func marshalIndent(v any) ([]byte, error) {
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(sb.String()), nil
}
