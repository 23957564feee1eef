package evidence

import "testing"

// An evaluation without a verified grader job (a control whose grader job
// the evidence lacks) is an error, never a nil dereference.
func TestJudgedWithoutGraderIsAnError(t *testing.T) {
	for _, e := range []*evaluation{{}, {candidate: &verifiedJob{}}} {
		if _, err := e.judged(); err == nil {
			t.Errorf("judged of %+v: got no error, want one naming the missing grader job", e)
		}
	}
}
