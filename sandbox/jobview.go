package sandbox

import (
	"encoding/json"
	"time"
)

// JobState is how far a job got on the daemon, as far as its journal can
// prove.
type JobState string

// The states, in order. JobFinished and JobUncertain are terminal.
const (
	// JobAccepted: the job and its receipt are durable; nothing was handed
	// to the broker yet, so the job provably never ran.
	JobAccepted JobState = "accepted"
	// JobDispatched: the job was handed to the broker; a container may exist.
	JobDispatched JobState = "dispatched"
	// JobCreated: the job's container exists (ContainerID).
	JobCreated JobState = "created"
	// JobStarted: the job's container was started.
	JobStarted JobState = "started"
	// JobFinished: the job ended and its signed result is durable.
	JobFinished JobState = "finished"
	// JobUncertain: the job ended without proof of what happened; its
	// signed result says so (status uncertain).
	JobUncertain JobState = "uncertain"
)

// Terminal reports whether no further transition can happen.
func (s JobState) Terminal() bool { return s == JobFinished || s == JobUncertain }

// JobView is the daemon's JSON view of a job, as its API answers and its
// client reads it. Receipt and Result are the signed envelopes, byte for
// byte as the journal holds them; Status is unverified until a client
// checks the result's signature.
type JobView struct {
	ID              string          `json:"id"`
	Digest          string          `json:"digest"`
	State           JobState        `json:"state"`
	Status          Status          `json:"status,omitempty"`
	ContainerID     string          `json:"container_id,omitempty"`
	AcceptedAt      time.Time       `json:"accepted_at"`
	StartedAt       time.Time       `json:"started_at,omitzero"`
	FinishedAt      time.Time       `json:"finished_at,omitzero"`
	CancelRequested bool            `json:"cancel_requested,omitempty"`
	Receipt         json.RawMessage `json:"receipt"`
	Result          json.RawMessage `json:"result,omitempty"`
}

// Terminal reports whether the job has ended.
func (v JobView) Terminal() bool { return v.State.Terminal() }
