package server

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// A job a restart queued again runs only if the fleet still has it
// claimed by this host (or cannot be read): ended, another host's, queued
// (another host may take it: it would run twice) or another job under its
// id, it does not.
func TestARequeuedJobRunsOnlyIfThisHostStillHoldsItsClaim(t *testing.T) {
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	cases := []struct {
		name    string
		rec     *fleet.Record // nil: the fleet has no record
		wantRun bool
	}{
		{"claimed by this host", &fleet.Record{ID: "j", Digest: digest, State: fleet.StateClaimed, Host: "h1"}, true},
		{"no record (unreadable)", nil, true},
		{"ended", &fleet.Record{ID: "j", Digest: digest, State: fleet.StateEnded, Host: "h2", EndedBy: "h2"}, false},
		{"claimed by another host", &fleet.Record{ID: "j", Digest: digest, State: fleet.StateClaimed, Host: "h2"}, false},
		{"queued", &fleet.Record{ID: "j", Digest: digest, State: fleet.StateQueued}, false},
		{"another job under its id", &fleet.Record{ID: "j", Digest: "sha256:" + digest[9:] + "2", State: fleet.StateClaimed, Host: "h1"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ff := newFakeFleet()
			if tc.rec != nil {
				ff.records["j"] = *tc.rec
			}
			s := &Server{cfg: Config{Name: "h1", Fleet: &FleetConfig{Coordinator: ff}}, log: slog.New(slog.DiscardHandler)}
			cause, ended := s.endedByTheFleet(context.Background(), journal.Record{ID: "j", Digest: digest})
			if ended == tc.wantRun {
				t.Fatalf("ended %v (%q), want it to run: %v", ended, cause, tc.wantRun)
			}
			if ended && cause == "" {
				t.Error("no cause given")
			}
		})
	}
}

// A fleet that did not answer the read of one requeued job is not asked
// about the next ones for a while (each would wait, then run anyway);
// asked again after it, and answering, it decides again.
func TestASilentFleetIsNotAskedAboutEveryRequeuedJob(t *testing.T) {
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	ff := newFakeFleet()
	silent := true
	ff.onRecord = func(string) error {
		if silent {
			return fmt.Errorf("no quorum: %w", fleet.ErrUnavailable)
		}
		return nil
	}
	for _, id := range []string{"j1", "j2", "j3"} {
		ff.records[id] = fleet.Record{ID: id, Digest: digest, State: fleet.StateEnded, EndedBy: "h2"}
	}
	s := &Server{cfg: Config{Name: "h1", Fleet: &FleetConfig{Coordinator: ff}}, log: slog.New(slog.DiscardHandler)}
	ended := func(id string) bool {
		_, ended := s.endedByTheFleet(context.Background(), journal.Record{ID: id, Digest: digest})
		return ended
	}
	if ended("j1") || ended("j2") {
		t.Fatal("a job ended on a fleet that did not answer")
	}
	if n := len(ff.callsAbout("j1")) + len(ff.callsAbout("j2")); n != 1 {
		t.Fatalf("the fleet was asked %d times about two requeued jobs, right after it did not answer; want once", n)
	}
	// Later, it answers again.
	silent = false
	s.setFleetSilent(time.Now().Add(-requeuedReadWait - time.Second))
	if !ended("j3") {
		t.Fatal("once the fleet answers again, a job it ended still runs here")
	}
	if !s.fleetSilentSince().IsZero() {
		t.Error("an answer did not end the silence")
	}
}
