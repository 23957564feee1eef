package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Config wires a Server. Only cmd/ fills it from flags.
type Config struct {
	// Name is the broker's name, reported by the identity endpoint.
	Name string
	// Version is the daemon's version.
	Version string
	// Broker runs and recovers jobs.
	Broker Broker
	// Blobs is the content-addressed store for uploads and artifacts.
	Blobs *store.Store
	// Journal is the durable record of jobs.
	Journal *journal.Journal
	// Signer signs receipts and results.
	Signer *receipt.Signer
	// Supervisor serves the assess endpoint; nil disables it (404).
	Supervisor *supervisor.Supervisor
	// Preflight refuses a job the broker would refuse before running it
	// (an image that is not present, an input blob that is missing), so
	// that such a job is never accepted. Nil accepts everything.
	Preflight func(ctx context.Context, job sandbox.Job) error
	// Concurrency is how many jobs run at once.
	Concurrency int
	// QueueSize is how many accepted jobs may wait for a slot; beyond it a
	// submission is answered 429 with Retry-After.
	QueueSize int
	// MaxJobBytes caps a submitted job's JSON; MaxBlobBytes an upload.
	MaxJobBytes, MaxBlobBytes int64
	// MaxUploadBytes caps the uploads no accepted job names yet, together:
	// beyond it an upload is answered 507.
	MaxUploadBytes int64
	// BlobBudget is the most bytes the blob store keeps: beyond it the
	// least recently used blobs no queued or running job needs are
	// removed. VolumeBudget is the same for read-only input volumes (a job
	// whose volume was removed has it populated again). GCInterval is how
	// often both are collected (also at start and on POST /v1/gc).
	BlobBudget, VolumeBudget int64
	GCInterval               time.Duration
	// Retain is how long the journal keeps an ended job's record (and its
	// signed envelopes) after it ended; then the record goes, checked at
	// every collection, and the blobs only it named with the collection.
	// The Supervisor's retained assessments go by the same age, counted
	// from when each was retained. Zero keeps every record and assessment.
	Retain time.Duration
	// GCMinAge spares, in a collection while the daemon runs, every blob
	// used more recently (a selfcheck's inputs, a result a client is
	// about to fetch).
	GCMinAge time.Duration
	// BlobLeaseTTL is how long an upload no job names is kept: the time a
	// client has between uploading a job's inputs and submitting it.
	BlobLeaseTTL time.Duration
	// MaxWait caps a wait request's timeout.
	MaxWait time.Duration
	// ReapGrace is how old a labelled container unknown to the journal must
	// be before it is removed; ReapInterval how often the reaper looks.
	ReapGrace, ReapInterval time.Duration
	// DrainTimeout is how long Shutdown waits for running jobs.
	DrainTimeout time.Duration
	// Runtime is what the jobs the plan endpoint prescribes run on: runc
	// ("" too) or runsc, the operator's choice (the broker must allow
	// runsc), as an evaluation's Request.Runtime is.
	Runtime string
	// Tenants, when set, separates the daemon's callers (authz.go): each
	// sees, waits for and cancels its own jobs and reads its own blobs
	// only, within its quota. Nil lets every caller do everything.
	// Tenants.Reload changes them while the daemon serves.
	Tenants *Tenants
	// Logger receives JSON logs; nil discards them.
	Logger *slog.Logger
	// Fleet, when set, joins the daemon to a fleet (fleet.go).
	Fleet *FleetConfig
	// Fault, when set, is called at each step of a job's life ("accepted",
	// "created", "started", broker.CollectSteps, "exited"); tests use it to kill the process at
	// a precise point. Production leaves it nil.
	Fault func(step, jobID string)
}

// Default returns the limits a dedicated host starts with.
func Default() Config {
	return Config{
		Name:           "sandboxd",
		Version:        "0.1.0-dev",
		Concurrency:    4,
		QueueSize:      64,
		MaxJobBytes:    1 << 20,
		MaxBlobBytes:   1 << 30,
		MaxUploadBytes: 8 << 30,
		MaxWait:        5 * time.Minute,
		BlobLeaseTTL:   time.Hour,
		BlobBudget:     20 << 30,
		VolumeBudget:   10 << 30,
		GCInterval:     10 * time.Minute,
		GCMinAge:       10 * time.Minute,
		ReapGrace:      2 * time.Minute,
		ReapInterval:   5 * time.Minute,
		DrainTimeout:   30 * time.Second,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.Broker == nil || c.Blobs == nil || c.Journal == nil || c.Signer == nil:
		return errors.New("server config: Broker, Blobs, Journal and Signer are required")
	case c.Concurrency < 1 || c.Concurrency > 256:
		return fmt.Errorf("server config: Concurrency %d is not in [1, 256]", c.Concurrency)
	case c.QueueSize < 0:
		return fmt.Errorf("server config: QueueSize %d is negative", c.QueueSize)
	case c.MaxJobBytes < 1024 || c.MaxBlobBytes < 1024:
		return errors.New("server config: MaxJobBytes and MaxBlobBytes must be at least 1 KiB")
	case c.MaxUploadBytes < c.MaxBlobBytes:
		return fmt.Errorf("server config: MaxUploadBytes %d is under MaxBlobBytes %d", c.MaxUploadBytes, c.MaxBlobBytes)
	case c.BlobBudget <= 0 || c.VolumeBudget <= 0:
		return fmt.Errorf("server config: BlobBudget %d and VolumeBudget %d must be positive", c.BlobBudget, c.VolumeBudget)
	case c.Retain < 0:
		return fmt.Errorf("server config: Retain %v is negative", c.Retain)
	case c.GCMinAge < 0:
		return fmt.Errorf("server config: GCMinAge %v is negative", c.GCMinAge)
	case c.GCInterval < time.Second:
		return fmt.Errorf("server config: GCInterval %v is under 1s", c.GCInterval)
	case c.BlobLeaseTTL < time.Minute:
		return fmt.Errorf("server config: BlobLeaseTTL %v is under 1m", c.BlobLeaseTTL)
	case c.MaxWait < time.Second:
		return fmt.Errorf("server config: MaxWait %v is under 1s", c.MaxWait)
	case c.ReapGrace < 0 || c.ReapInterval < time.Second:
		return errors.New("server config: ReapGrace must not be negative and ReapInterval must be at least 1s")
	case c.DrainTimeout < 0:
		return errors.New("server config: DrainTimeout is negative")
	case c.Runtime != "" && c.Runtime != sandbox.RuntimeRunc && c.Runtime != sandbox.RuntimeRunsc:
		return fmt.Errorf("server config: Runtime %q is not runc or runsc", c.Runtime)
	}
	if c.Fleet != nil {
		return c.Fleet.validate(c.Name)
	}
	return nil
}
