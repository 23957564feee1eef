package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"

	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/sandbox"
)

// openAPI compiles the schemas of the OpenAPI document (JSON Schema 2020-12,
// as OpenAPI 3.1 has it).
type openAPI struct {
	t *testing.T
	c *jsonschema.Compiler
}

func loadOpenAPI(t *testing.T) *openAPI {
	data, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	if err := c.AddResource("openapi.json", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	return &openAPI{t: t, c: c}
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func (o *openAPI) check(what, pointer string, body []byte) {
	o.t.Helper()
	sch, err := o.c.Compile("openapi.json#" + pointer)
	if err != nil {
		o.t.Fatalf("%s: no schema at %s: %v", what, pointer, err)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		o.t.Fatalf("%s: not JSON: %v: %s", what, err, body)
	}
	if err := sch.Validate(v); err != nil {
		o.t.Errorf("%s does not match the document: %v\n%s", what, err, body)
	}
}

// response checks a real response against the schema the document gives
// for its route, method and status code.
func (o *openAPI) response(route, method string, code int, body []byte) {
	o.t.Helper()
	o.check(fmt.Sprintf("%s %s %d", method, route, code),
		fmt.Sprintf("/paths/%s/%s/responses/%d/content/application~1json/schema", pointerEscape(route), strings.ToLower(method), code), body)
}

func (o *openAPI) schema(name string, body []byte) {
	o.t.Helper()
	o.check(name, "/components/schemas/"+name, body)
}

// envelope checks an envelope's decoded statement and its predicate.
func (o *openAPI) envelope(what string, env []byte, predicate string) {
	o.t.Helper()
	o.schema("Envelope", env)
	var e sandbox.Envelope
	if err := json.Unmarshal(env, &e); err != nil {
		o.t.Fatal(err)
	}
	payload, err := base64.StdEncoding.DecodeString(e.Payload)
	if err != nil {
		o.t.Fatal(err)
	}
	o.schema("Statement", payload)
	var st sandbox.Statement
	if err := json.Unmarshal(payload, &st); err != nil {
		o.t.Fatal(err)
	}
	o.schema(predicate, st.Predicate)
}

// Every body the daemon answers, success and error, is the one the OpenAPI
// document types; so are the statements inside its envelopes.
func TestResponsesMatchOpenAPI(t *testing.T) {
	ctx := context.Background()
	api := loadOpenAPI(t)
	b, blob := exampleBundle(t)
	f := assessFixture(t)
	call := func(route, method, path string, body []byte) (int, []byte) {
		t.Helper()
		resp, out := f.do(t, method, path, body)
		api.response(route, method, resp.StatusCode, out)
		return resp.StatusCode, out
	}

	small := []byte("hello")
	call("/v1/blobs/{digest}", "PUT", "/v1/blobs/"+sandbox.DigestBytes(small), small)
	call("/v1/blobs/{digest}", "PUT", "/v1/blobs/"+sandbox.DigestBytes(small), small)
	call("/v1/blobs/{digest}", "PUT", "/v1/blobs/sha256:nothex", small)
	call("/v1/blobs/{digest}", "GET", "/v1/blobs/"+sandbox.DigestBytes([]byte("absent")), nil)

	ws := sandbox.DigestBytes([]byte("workspace"))
	if err := b.CopyLayer(f.srv.cfg.Blobs); err != nil {
		t.Fatal(err)
	}
	planReq, _ := json.Marshal(sandbox.PlanRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), WorkspaceDigest: ws, CandidateJobID: "c1", GraderJobID: "g1", Controls: controlIDs("k")})
	api.schema("PlanRequest", planReq)
	code, out := call("/v1/plan", "POST", "/v1/plan", planReq)
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, out)
	}
	var p sandbox.Plan
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	call("/v1/plan", "POST", "/v1/plan", []byte(`{"bundle_manifest":"bm90IGEgbWFuaWZlc3Q="}`))

	submit := func(j sandbox.Job) sandbox.JobView {
		body, _ := json.Marshal(j)
		api.schema("SealedJob", body)
		code, out := call("/v1/jobs", "POST", "/v1/jobs", body)
		if code/100 != 2 {
			t.Fatalf("submit %s: %d %s", j.ID, code, out)
		}
		_, out = call("/v1/jobs/{id}/wait", "GET", "/v1/jobs/"+j.ID+"/wait?timeout=5s", nil)
		var v sandbox.JobView
		json.Unmarshal(out, &v)
		if !v.Terminal() {
			t.Fatalf("job %s did not end: %s", j.ID, out)
		}
		api.envelope("receipt", v.Receipt, "ReceiptPredicate")
		api.envelope("result", v.Result, "CompletionPredicate")
		return v
	}
	submit(*p.Candidate)
	export, err := evaluate.ExportOf(ctx, f.srv.cfg.Blobs, sandbox.Result{}, b.Manifest.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	cres := sandbox.Result{Schema: sandbox.ResultSchema, JobID: p.Candidate.ID, JobDigest: p.Candidate.Digest}
	g, err := sandbox.GraderJob(p.Grader, *p.Candidate, cres, export)
	if err != nil {
		t.Fatal(err)
	}
	submit(g)
	body, _ := json.Marshal(g)
	call("/v1/jobs", "POST", "/v1/jobs", body) // again: 200
	g.Argv = []string{"other"}
	g.Digest = ""
	g.Seal()
	body, _ = json.Marshal(g)
	call("/v1/jobs", "POST", "/v1/jobs", body) // another job under the id: 409
	call("/v1/jobs", "POST", "/v1/jobs", []byte(`{"schema":"sandboxd.job/v1"}`))
	call("/v1/jobs/{id}", "GET", "/v1/jobs/"+p.Candidate.ID, nil)
	call("/v1/jobs/{id}", "GET", "/v1/jobs/absent", nil)
	call("/v1/jobs/{id}/wait", "GET", "/v1/jobs/absent/wait", nil)
	call("/v1/jobs/{id}/wait", "GET", "/v1/jobs/c1/wait?timeout=soon", nil)
	call("/v1/jobs/{id}/cancel", "POST", "/v1/jobs/"+p.Candidate.ID+"/cancel", nil)
	call("/v1/jobs/{id}/cancel", "POST", "/v1/jobs/absent/cancel", nil)
	call("/v1/identity", "GET", "/v1/identity", nil)
	call("/v1/gc", "POST", "/v1/gc", nil)
	call("/healthz", "GET", "/healthz", nil)
	call("/readyz", "GET", "/readyz", nil)

	assessReq, _ := json.Marshal(sandbox.AssessRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), GraderJobID: "g1", CandidateJobID: "c1", WorkspaceDigest: ws})
	withControls, _ := json.Marshal(sandbox.AssessRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), GraderJobID: "g1", CandidateJobID: "c1", WorkspaceDigest: ws, Controls: controlIDs("k")})
	api.schema("AssessRequest", withControls)
	code, out = call("/v1/assess", "POST", "/v1/assess", assessReq)
	if code != http.StatusOK {
		t.Fatalf("assess: %d %s", code, out)
	}
	var ar sandbox.AssessResponse
	if err := json.Unmarshal(out, &ar); err != nil {
		t.Fatal(err)
	}
	api.envelope("assessment", ar.Assessment, "Assessment")
	call("/v1/assess", "POST", "/v1/assess", []byte(`{"grader_job_id":"absent"}`))
	call("/v1/assess", "POST", "/v1/assess", []byte(`{"unknown":1}`))
}

// The document bounds file_count where jobs are validated: at
// sandbox.MaxFileCount, from the signed result's bound.
func TestOpenAPIFileCountIsTheValidatedOne(t *testing.T) {
	sch, err := loadOpenAPI(t).c.Compile("openapi.json#/components/schemas/Limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{0, sandbox.DefaultLimits().FileCount, sandbox.MaxFileCount, sandbox.MaxFileCount + 1, 1_000_000} {
		l := sandbox.DefaultLimits()
		l.FileCount = n
		b, _ := json.Marshal(l)
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		doc, valid := sch.Validate(v) == nil, l.Validate("limits") == nil
		if doc != valid {
			t.Errorf("file_count %d: the document accepts it: %v, Validate: %v", n, doc, valid)
		}
	}
}
