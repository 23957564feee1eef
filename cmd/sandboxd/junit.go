package main

import (
	"github.com/sandboxd/sandboxd/internal/junitreport"
	"github.com/sandboxd/sandboxd/internal/supervisor"
)

// writeJUnit writes retained assessment bytes (run's or assess's verified
// one) as JUnit XML, atomically.
func writeJUnit(path string, assessment []byte) error {
	a, err := supervisor.DecodeAssessment(assessment)
	if err != nil {
		return err
	}
	return junitreport.WriteFile(path, a)
}
