// Package evaluate owns what an evaluation is. An Evaluation, built once
// from a bundle (Of, or New from a manifest checked by digest) and the
// host's runtime, holds everything the bundle prescribes: the candidate
// job on a workspace and the grader job on what it exported (or on the
// workspace itself without a candidate command), under ids JobID names or
// a caller reserved (Plan); the hand-over of the candidate's export, with
// the reader rules' word on it (Handover); the controls' workspaces,
// rebuilt from the bundle's layer (ControlWorkspace); and the judging of a
// set of verified results (Accept takes only the prescribed jobs, Evidence
// and Judge give them to the supervisor).
//
// Whoever runs or judges an evaluation only supplies results to it: Run
// (`sandboxd run`) runs each control's jobs and the candidate's, signs a
// receipt and a result for every job (verified again against the signer's
// own key) and judges them; the daemon's plan and assess endpoints answer
// its Plan and judge what Accept takes; the evidence check (`sandboxd
// assess`) rebuilds every expected job and export from it and judges
// again. It never reads a verdict from stdout or stderr, never lets a
// candidate's job see the bundle, and never gives the grader anything of
// the candidate's but the read-only export. A candidate export the reader
// rules refuse is evidence (the verdict is failed), not an error.
package evaluate
