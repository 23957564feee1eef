package main

// verifyJSON is `sandboxd verify --json` (docs/schema/verify.json).
type verifyJSON struct {
	Verified  bool                 `json:"verified"`
	Envelopes []verifyEnvelopeJSON `json:"envelopes"`
	// Error says why the whole does not verify when no envelope does:
	// --expect and no test-result given.
	Error string `json:"error,omitempty"`
}

type verifyEnvelopeJSON struct {
	Path     string   `json:"path"`
	Verified bool     `json:"verified"`
	Kind     string   `json:"kind"` // receipt, result, test-result, assessment; "" when it did not verify
	JobID    string   `json:"job_id,omitempty"`
	Status   string   `json:"status,omitempty"`  // a result's job status
	Result   string   `json:"result,omitempty"`  // a test-result's PASSED or FAILED
	Verdict  string   `json:"verdict,omitempty"` // a signed assessment's verdict
	KeyIDs   []string `json:"key_ids,omitempty"`
	Notes    []string `json:"notes"`
	Error    string   `json:"error,omitempty"` // the failed check first, as in the text output
}

func verifyReport(envs []*verified, noTestResult bool) verifyJSON {
	rep := verifyJSON{Verified: true, Envelopes: []verifyEnvelopeJSON{}}
	if noTestResult {
		rep.Verified, rep.Error = false, "verdict: --expect was given, but no test-result statement"
	}
	for _, v := range envs {
		e := verifyEnvelopeJSON{Path: v.path, Verified: v.err == nil, Notes: append([]string{}, v.notes...)}
		switch {
		case v.err != nil:
			e.Error = describeFailure(v.err)
			rep.Verified = false
		case v.assessment != nil:
			a := v.assessment.Assessment
			e.Kind, e.JobID, e.Verdict, e.KeyIDs = "assessment", a.GraderJob, string(a.Verdict), v.assessment.KeyIDs
		case v.testResult != nil:
			e.Kind, e.Result, e.KeyIDs = "test-result", v.testResult.Result, v.testResult.KeyIDs
		case v.att.Receipt != nil:
			e.Kind, e.JobID, e.KeyIDs = "receipt", v.att.Receipt.Job.ID, v.att.KeyIDs
		case v.att.Completion != nil:
			e.Kind, e.JobID, e.Status, e.KeyIDs = "result", v.att.Completion.Result.JobID, string(v.att.Completion.Result.Status), v.att.KeyIDs
		}
		rep.Envelopes = append(rep.Envelopes, e)
	}
	return rep
}
