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
		// The first is asked until this ends (requeuedReadWait, as the
		// daemon calls it).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, ended := s.endedByTheFleet(ctx, journal.Record{ID: id, Digest: digest})
		return ended
	}
	if ended("j1") || ended("j2") {
		t.Fatal("a job ended on a fleet that did not answer")
	}
	if n := len(ff.callsAbout("j2")); len(ff.callsAbout("j1")) == 0 || n != 0 {
		t.Fatalf("the fleet was asked %d times about the second requeued job, right after it did not answer about the first; want none", n)
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

// A fleet that cannot answer for a moment (a stream or the cluster's
// metadata between leaders: a record is read from the leader, and the
// refusal comes at once) is asked again within requeuedReadWait: the job
// it ended meanwhile is not run on the word of the first refusal.
func TestARequeuedJobIsAskedAboutAgainWhileTheFleetElects(t *testing.T) {
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	ff := newFakeFleet()
	refusals := 3
	ff.onRecord = func(string) error {
		if refusals > 0 {
			refusals--
			return fmt.Errorf("503 no leader: %w", fleet.ErrUnavailable)
		}
		return nil
	}
	ff.records["j"] = fleet.Record{ID: "j", Digest: digest, State: fleet.StateEnded, EndedBy: "h2"}
	s := &Server{cfg: Config{Name: "h1", Fleet: &FleetConfig{Coordinator: ff}}, log: slog.New(slog.DiscardHandler)}
	if cause, ended := s.endedByTheFleet(context.Background(), journal.Record{ID: "j", Digest: digest}); !ended {
		t.Fatalf("a job the fleet ended ran after %d refusals to read it (%q)", len(ff.callsAbout("j")), cause)
	}
	if !s.fleetSilentSince().IsZero() {
		t.Error("a fleet that answered is marked silent")
	}
}
