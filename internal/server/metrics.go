package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the daemon's Prometheus series, on a registry of its own.
type metrics struct {
	reg             *prometheus.Registry
	accepted        prometheus.Counter
	rejected        *prometheus.CounterVec
	jobs            *prometheus.CounterVec
	duration        prometheus.Histogram
	queueDepth      prometheus.Gauge
	running         prometheus.Gauge
	recovering      prometheus.Gauge
	createLatency   prometheus.Histogram
	startLatency    prometheus.Histogram
	bytesUploaded   prometheus.Counter
	bytesStaged     prometheus.Counter
	bytesCollected  prometheus.Counter
	envelopesSigned *prometheus.CounterVec
	reconcile       *prometheus.CounterVec
	retired         prometheus.Counter
	// assessmentsRetired counts retained assessments (and signed forms)
	// removed after --retain.
	assessmentsRetired prometheus.Counter
	// fleetPhases are a fleet host's steps of a job (registerFleet).
	fleetPhases *prometheus.HistogramVec
}

// The phases of a fleet job on the host that runs it (sandboxd_fleet_phase_seconds).
const (
	// phaseQueued: from the queue's storing the job's message (its
	// server's clock) to its first delivery to this host (this host's
	// clock; below zero counts as zero).
	phaseQueued = "queued"
	// phaseClaim: from the delivery to the claim made: the record read,
	// the inputs fetched, the claim and the held mark written.
	phaseClaim = "claim"
	// phaseReceipt: from the journal's acceptance to the receipt written
	// in the record.
	phaseReceipt = "receipt"
	// phasePublish: from the journal's result to the result written in
	// the record (with its outputs stored in the fleet, and every retry).
	phasePublish = "publish"
)

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_jobs_accepted_total", Help: "Jobs durably accepted (first submissions only)."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_submissions_rejected_total", Help: "Submissions refused, by reason."}, []string{"reason"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_jobs_finished_total", Help: "Jobs ended, by result status."}, []string{"status"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandboxd_job_duration_seconds", Help: "Time from dispatch to signed result.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 14)}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_queue_depth", Help: "Accepted jobs waiting for a slot."}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_jobs_running", Help: "Jobs this process dispatched that hold a concurrency slot."}),
		recovering: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_jobs_recovering", Help: "Jobs an earlier process left running, being recovered; they hold concurrency slots too."}),
		createLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandboxd_container_create_seconds", Help: "Time from dispatch to a created container (staging included).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		startLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandboxd_container_start_seconds", Help: "Time from a created container to its start.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		bytesUploaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_blob_bytes_uploaded_total", Help: "Bytes of blobs stored through the API."}),
		bytesStaged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_bytes_staged_total", Help: "Bytes of input blobs handed to dispatched jobs."}),
		bytesCollected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_bytes_collected_total", Help: "Bytes of artifacts and logs collected from jobs."}),
		envelopesSigned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_envelopes_signed_total", Help: "DSSE envelopes signed, by kind."}, []string{"kind"}),
		reconcile: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_reconcile_actions_total", Help: "Recovery and reaping actions, by action."}, []string{"action"}),
		retired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_journal_records_removed_total", Help: "Records of ended jobs removed after --retain."}),
		assessmentsRetired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_assessments_removed_total", Help: "Retained assessments and signed forms removed after --retain."}),
	}
	m.reg.MustRegister(m.accepted, m.rejected, m.jobs, m.duration, m.queueDepth, m.running, m.recovering,
		m.createLatency, m.startLatency, m.bytesUploaded, m.bytesStaged, m.bytesCollected,
		m.envelopesSigned, m.reconcile, m.retired, m.assessmentsRetired,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerPool adds the broker's pool of started sandboxes.
func (m *metrics) registerPool(counts func() (ready, starting, used int)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_pool_ready", Help: "Sandboxes started ahead of their jobs and ready."},
			func() float64 { r, _, _ := counts(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_pool_starting", Help: "Sandboxes of the pool being started."},
			func() float64 { _, st, _ := counts(); return float64(st) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sandboxd_pool_used_total", Help: "Jobs that ran in a sandbox of the pool."},
			func() float64 { _, _, u := counts(); return float64(u) }),
	)
}

// registerFleet adds a fleet host's figures.
func (m *metrics) registerFleet(counts func() map[string]int) {
	m.fleetPhases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandboxd_fleet_phase_seconds",
		Help:    "A fleet job's steps on this host: queued (stored to first delivered here, across two clocks), claim (delivered to claimed), receipt (journaled to receipt in the record), publish (result journaled to result in the record).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}, []string{"phase"})
	for _, p := range []string{phaseQueued, phaseClaim, phaseReceipt, phasePublish} {
		m.fleetPhases.WithLabelValues(p) // every phase listed from the start, at zero
	}
	m.reg.MustRegister(m.fleetPhases)
	for _, c := range []struct{ key, name, help string }{
		{"claimed", "sandboxd_fleet_claimed_total", "Fleet jobs this host claimed."},
		{"published", "sandboxd_fleet_published_total", "Fleet results this host published."},
		{"expired", "sandboxd_fleet_expired_total", "Other hosts' fleet jobs this host ended uncertain when their lease lapsed."},
		{"late", "sandboxd_fleet_late_results_total", "Results of this host not taken: the fleet had ended the job."},
		{"refused", "sandboxd_fleet_refused_messages_total", "Job messages refused (malformed, digest not verified, id bound to another digest)."},
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(counts()[c.key]) }))
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxd_fleet_following", Help: "Fleet jobs whose results this host is to publish."},
		func() float64 { return float64(counts()["following"]) }))
}
