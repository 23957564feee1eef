// Package evaluate runs one candidate against one evaluator bundle end to
// end: the candidate job (when the bundle declares one), the grader job
// with the candidate's export mounted read-only, the bundle's control
// runs, a signed receipt and result for every job (verified again against
// the broker's own key), and the supervisor's assessment.
//
// It is the one sequence `sandboxd run` and the daemon share, and the one
// definition of what an evaluation is: the jobs a bundle prescribes
// (CandidateJob, GraderJob, with ids JobID names), the control workspaces
// rebuilt from the bundle (ControlWorkspace), and the supervisor's evidence
// of them (Evidence, AssessRun), which a run, the daemon's assess endpoint
// and a re-check of an evidence directory all build the same way. It never
// reads a verdict from stdout or stderr, never lets a candidate's job see
// the bundle, and never gives the grader anything of the candidate's but
// the read-only export.
package evaluate
