// Package progress reports the progress of long steps (an image build, a
// bundle pack, a workspace ingest, a job's staging, run and collection) to
// a person or a CI log. On a terminal a step is one line that updates in
// place (step, phase, bytes or files, elapsed); elsewhere each step and
// each phase is one plain line, so that a CI log reads in order. A
// Reporter is passed down to what reports; there is no global one.
//
// Progress is written to the writer it is given, which the commands make
// stderr: it never goes to stdout, whose content is a command's result.
package progress
