package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Tenancy. With Config.Tenants set, every request but /healthz and
// /readyz is made by a tenant: the unix socket peer's uid or gid
// (SO_PEERCRED, taken once per connection in ConnContext) or the verified
// mTLS client certificate's subject. An identity that is no tenant's gets
// 403 everywhere; a tenant sees only its own jobs and blobs, and anything
// else is answered exactly as if it did not exist (404, the same body).
// Without Tenants nothing is checked: whoever reaches the socket or holds
// a certificate of the client CA may do everything.

var (
	// errForbidden marks a request its caller may not make at all (no
	// tenant, or a role without the right): 403.
	errForbidden = errors.New("forbidden")
	// errTenantQuota marks a submission over its tenant's quota.
	errTenantQuota = errors.New("tenant quota exceeded")
)

// peer is who is at the other end of a connection.
type peer struct {
	unix     bool
	uid, gid uint32
	groups   []uint32 // supplementary groups at connect (SO_PEERGROUPS)
	subject  string   // a verified client certificate's subject
}

func (p peer) String() string {
	switch {
	case p.unix:
		return fmt.Sprintf("unix peer uid %d gid %d", p.uid, p.gid)
	case p.subject != "":
		return fmt.Sprintf("client certificate %q", p.subject)
	}
	return "an unidentified peer"
}

type peerKey struct{}
type tenantKey struct{}

// withPeer returns ctx carrying the identity p.
func withPeer(ctx context.Context, p peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// ConnContext is http.Server.ConnContext for the daemon's listeners: a
// unix socket connection carries its peer's credentials, read once, as
// the kernel recorded them at connect (SO_PEERCRED). A TLS connection's
// subject is read per request, once the handshake verified it.
func (s *Server) ConnContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	p, err := unixPeer(uc)
	if err != nil {
		// No identity: with tenants, every /v1 request of it gets 403.
		s.log.Warn("unix peer credentials", "error", err)
		return ctx
	}
	return withPeer(ctx, p)
}

// unixPeer reads a unix socket connection's peer credentials.
func unixPeer(c *net.UnixConn) (peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	p := peer{unix: true, uid: cred.Uid, gid: cred.Gid}
	var gerr error
	if err := raw.Control(func(fd uintptr) { p.groups, gerr = peerGroups(fd) }); err != nil {
		return peer{}, err
	}
	if gerr != nil {
		return peer{}, fmt.Errorf("SO_PEERGROUPS: %w", gerr)
	}
	return p, nil
}

// peerGroups reads the supplementary groups the peer had when it
// connected, as the kernel recorded them (SO_PEERGROUPS, Linux 4.13):
// unlike a read of /proc/<pid>, it cannot name another process's. A
// kernel without it gives none (only the primary gid is then matched).
func peerGroups(fd uintptr) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n/4) > len(buf):
			buf = make([]uint32, n/4)
			continue
		case errno == unix.ENOPROTOOPT:
			return nil, nil
		case errno != 0:
			return nil, errno
		}
		return buf[:n/4], nil
	}
}

// peerOf is the identity of a request: its connection's unix credentials,
// or its verified client certificate's subject.
func peerOf(r *http.Request) peer {
	if p, ok := r.Context().Value(peerKey{}).(peer); ok {
		return p
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		return peer{subject: r.TLS.VerifiedChains[0][0].Subject.String()}
	}
	return peer{}
}

// tenantOf is the tenant making the request of ctx, in its role (nil
// without tenants, and for the daemon's own work: fleet claims, recovery).
func tenantOf(ctx context.Context) *caller {
	c, ok := ctx.Value(tenantKey{}).(caller)
	if !ok {
		return nil
	}
	return &c
}

// tenantName is the name recorded as a job's or upload's owner.
func tenantName(ctx context.Context) string {
	if t := tenantOf(ctx); t != nil {
		return t.Name
	}
	return ""
}

// authorize resolves the caller's tenant and refuses what its role may
// not do. /healthz and /readyz stay open to every peer; /metrics and
// POST /v1/gc are an admin's.
func (s *Server) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Tenants == nil || r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		p := peerOf(r)
		t, ok := s.cfg.Tenants.lookup(p)
		if !ok {
			s.m.rejected.WithLabelValues("forbidden").Inc()
			writeError(w, http.StatusForbidden, fmt.Errorf("%s is no tenant of this daemon (%s): %w", p, s.cfg.Tenants.File(), errForbidden))
			return
		}
		if !t.Role.may(r.Method, r.URL.Path) {
			s.m.rejected.WithLabelValues("forbidden").Inc()
			writeError(w, http.StatusForbidden, fmt.Errorf("tenant %q (role %s) may not %s %s: %w", t.Name, t.Role, r.Method, r.URL.Path, errForbidden))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, t)))
	})
}

// may reports whether the role may make a request at all (whose jobs and
// blobs it reaches is checked by each route).
func (r Role) may(method, path string) bool {
	switch {
	case r == RoleAdmin:
		return true
	case path == "/metrics" || path == "/v1/gc":
		return false
	case r == RoleSubmitter:
		return true
	}
	return r == RoleReader && method == http.MethodGet && strings.HasPrefix(path, "/v1/")
}

// mayRead reports whether the request's tenant may see rec: its own job,
// or any job for an admin. A record of no tenant (from before tenants, or
// a job claimed from the fleet) is an admin's alone.
func (s *Server) mayRead(ctx context.Context, rec journal.Record) bool {
	if s.cfg.Tenants == nil {
		return true
	}
	t := tenantOf(ctx)
	if t == nil {
		return false
	}
	return t.Role == RoleAdmin || (rec.Tenant != "" && rec.Tenant == t.Name)
}

// errJobNotFound is the error of a job the journal does not hold, word for
// word: what another tenant's job answers too.
func errJobNotFound(id string) error { return fmt.Errorf("job %s: %w", id, sandbox.ErrNotFound) }

// errBlobNotFound is the store's error of a missing blob, word for word.
func errBlobNotFound(d string) error { return fmt.Errorf("blob %s: %w", d, store.ErrNotFound) }

// ownedRecord is the record of job id if the request's tenant may see it;
// another tenant's job is not found, as a missing one.
func (s *Server) ownedRecord(ctx context.Context, id string) (journal.Record, error) {
	rec, err := s.jobRecord(ctx, id)
	if err != nil {
		return rec, err
	}
	if !s.mayRead(ctx, rec) {
		return journal.Record{}, errJobNotFound(id)
	}
	return rec, nil
}

// mayReadBlob reports whether the request's tenant may read blob d: one it
// uploaded, or an output of one of its jobs. A job's inputs are never
// another tenant's to read (a bundle's layer holds its hidden tests).
func (s *Server) mayReadBlob(ctx context.Context, d string) (bool, error) {
	if s.cfg.Tenants == nil {
		return true, nil
	}
	t := tenantOf(ctx)
	switch {
	case t == nil:
		return false, nil
	case t.Role == RoleAdmin:
		return true, nil
	}
	return s.cfg.Journal.BlobGranted(t.Name, d)
}

// checkTenantJob refuses a job its tenant may not submit: a limit over its
// quota (403), or an input it may not read (422, as a missing blob: a
// job must not stage another tenant's upload, whose bytes its outputs
// could then carry).
func (s *Server) checkTenantJob(ctx context.Context, t *caller, job sandbox.Job) *refusal {
	limits := limitFields(job.Limits)
	for i, max := range limitFields(t.Quota.MaxLimits) {
		if max.value > 0 && limits[i].value > max.value {
			return &refusal{code: http.StatusForbidden, reason: "tenant_quota",
				err: fmt.Errorf("job.limits.%s %d is over tenant %q's quota max_limits.%s %d: %w", max.name, limits[i].value, t.Name, max.name, max.value, errTenantQuota)}
		}
	}
	for i, in := range job.Inputs {
		ok, err := s.mayReadBlob(ctx, in.Digest)
		if err != nil {
			return &refusal{code: http.StatusInternalServerError, err: err}
		}
		if !ok {
			return &refusal{code: http.StatusUnprocessableEntity, reason: "refused",
				err: fmt.Errorf("job.inputs[%d]: %w", i, errBlobNotFound(in.Digest))}
		}
	}
	return nil
}

// tenantLocks serialize one tenant's submissions, so that its count of
// jobs queued and running holds against submissions made at once.
type tenantLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *tenantLocks) lock(name string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sync.Mutex{}
	}
	m := l.m[name]
	if m == nil {
		m = &sync.Mutex{}
		l.m[name] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// admitTenant is admit for a tenant's submission: its quota and inputs
// checked first, its jobs queued and running counted under its lock.
func (s *Server) admitTenant(ctx context.Context, t *caller, job sandbox.Job, admit func() (journal.Record, bool, *refusal)) (journal.Record, bool, *refusal) {
	if rec, err := s.cfg.Journal.Get(job.ID); err == nil {
		if !s.mayRead(ctx, rec) {
			// Job ids are the callers' own: a taken one cannot be hidden,
			// but nothing of the job is told.
			return journal.Record{}, false, &refusal{code: http.StatusConflict, reason: "conflict",
				err: fmt.Errorf("job id %s is taken; choose another: %w", job.ID, sandbox.ErrConflict)}
		}
		return admit() // idempotent: the same answer as before, whatever the quota now
	}
	if ref := s.checkTenantJob(ctx, t, job); ref != nil {
		return journal.Record{}, false, ref
	}
	if ref := s.checkTenantBlobs(t); ref != nil {
		return journal.Record{}, false, ref
	}
	if t.Quota.MaxJobs == 0 {
		return admit()
	}
	defer s.tenantLocks.lock(t.Name)()
	n, err := s.activeJobs(t.Name)
	if err != nil {
		return journal.Record{}, false, &refusal{code: http.StatusInternalServerError, err: err}
	}
	if n >= t.Quota.MaxJobs {
		return journal.Record{}, false, &refusal{code: http.StatusTooManyRequests, reason: "tenant_quota", retryAfter: s.retryAfter(),
			err: fmt.Errorf("tenant %q has %d jobs queued or running, its quota max_jobs is %d; retry after the time in Retry-After: %w", t.Name, n, t.Quota.MaxJobs, errTenantQuota)}
	}
	return admit()
}

// admitAs is admit for the tenant of ctx (admitTenant), or for anyone
// without tenants. A job another tenant journaled under the same id at
// the same moment is a 409, naming nothing of it.
func (s *Server) admitAs(ctx context.Context, job sandbox.Job, admit func() (journal.Record, bool, *refusal)) (journal.Record, bool, *refusal) {
	t := tenantOf(ctx)
	if t == nil {
		return admit()
	}
	rec, existing, ref := s.admitTenant(ctx, t, job, admit)
	if ref == nil && existing && !s.mayRead(ctx, rec) {
		return journal.Record{}, false, &refusal{code: http.StatusConflict, reason: "conflict",
			err: fmt.Errorf("job id %s is taken; choose another: %w", job.ID, sandbox.ErrConflict)}
	}
	return rec, existing, ref
}

// asTenant is ctx acting for c (nil: for no tenant).
func asTenant(ctx context.Context, c *caller) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, tenantKey{}, *c)
}

// activeJobs counts a tenant's jobs that have not ended.
func (s *Server) activeJobs(tenant string) (int, error) {
	recs, err := s.cfg.Journal.List()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range recs {
		if r.Tenant == tenant && !r.State.Terminal() {
			n++
		}
	}
	return n, nil
}
