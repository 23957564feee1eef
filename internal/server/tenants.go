package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TenantsSchema is the schema string of a tenants file (--tenants).
const TenantsSchema = "sandboxd.tenants/v1"

// Role is what a tenant's identities may do.
type Role string

// The roles. A reader reads its tenant's jobs and blobs; a submitter also
// uploads, submits, cancels, plans and assesses; an admin does all of it
// for every tenant's jobs, and collects (POST /v1/gc) and reads /metrics.
const (
	RoleReader    Role = "reader"
	RoleSubmitter Role = "submitter"
	RoleAdmin     Role = "admin"
)

// Tenant is one entry of a tenants file: who acts for it, in which role
// (its identities), and how much it may ask for (its quota). Its jobs,
// uploads and their outputs are its own.
type Tenant struct {
	// Name names the tenant in job records, errors and logs.
	Name       string           `json:"name"`
	Identities []TenantIdentity `json:"identities"`
	Quota      Quota            `json:"quota"`
}

// TenantIdentity is who may act for a tenant, and in which role.
type TenantIdentity struct {
	Role Role `json:"role"`
	// UIDs and GIDs are unix socket peers (SO_PEERCRED: the peer's uid
	// and primary gid; SO_PEERGROUPS: its supplementary groups); a uid
	// match wins over the primary gid's, which wins over supplementary
	// groups' (which must agree on one tenant and role).
	UIDs []uint32 `json:"uids,omitempty"`
	GIDs []uint32 `json:"gids,omitempty"`
	// Subjects are verified mTLS client certificate subjects, as Go's
	// pkix.Name.String prints them (RFC 2253, e.g. "CN=team-a,O=example").
	Subjects []string `json:"subjects,omitempty"`
	// NATSUsers are the fleet's NATS users acting for the tenant: `sandboxd
	// fleet permissions` writes their NATS permissions from this file,
	// and the NATS servers enforce them (a host takes a job as the
	// tenant whose subject it was queued on).
	NATSUsers []string `json:"nats_users,omitempty"`
}

// caller is a tenant acting in one role.
type caller struct {
	*Tenant
	Role Role
}

// Quota is how much one tenant may ask of the daemon; zero fields are
// unbounded (the host's own limits still hold).
type Quota struct {
	// MaxLimits caps each limit a job may ask for, by its JSON name
	// (sandbox.Limits); a job over one is refused 403, naming it.
	MaxLimits sandbox.Limits `json:"max_limits"`
	// MaxJobs caps the tenant's jobs queued and running together; beyond
	// it a submission is refused 429 with Retry-After.
	MaxJobs int `json:"max_jobs,omitempty"`
	// MaxUploadBytes caps the bytes of the tenant's uploads no accepted
	// job names yet (leased) and those arriving; beyond it an upload is
	// refused 507. The daemon's --max-upload-bytes holds for all of them.
	MaxUploadBytes int64 `json:"max_upload_bytes,omitempty"`
	// MaxBlobBytes caps the bytes of the stored blobs the tenant holds:
	// those granted to it (its uploads, its jobs' outputs) that the store
	// holds, each counted once, at its size, with its uploads arriving.
	// An upload beyond it is refused 507, and so is a submission while
	// the tenant holds it all (the job's outputs would add to it).
	MaxBlobBytes int64 `json:"max_blob_bytes,omitempty"`
}

// Tenants is a parsed tenants file. Reload replaces its tenants while the
// daemon serves: a request is served as the tenant it was resolved to when
// it arrived.
type Tenants struct {
	cur atomic.Pointer[tenantTable]
	// reloaded is told of each reload that took (a fleet host makes the
	// stores of tenants new to it).
	mu       sync.Mutex
	reloaded []func()
}

// tenantTable is one reading of a tenants file.
type tenantTable struct {
	file      string
	tenants   []Tenant
	byUID     map[uint32]caller
	byGID     map[uint32]caller
	bySubject map[string]caller
	byNATS    map[string]caller
}

// tenantsFile is the file's JSON form.
type tenantsFile struct {
	Schema  string   `json:"schema"`
	Tenants []Tenant `json:"tenants"`
}

// ParseTenants decodes a tenants file strictly (unknown fields, a second
// JSON value, a duplicate name or identity are refused); every error names
// file and, where there is one, the entry.
func ParseTenants(file string, data []byte) (*Tenants, error) {
	bad := func(format string, a ...any) (*Tenants, error) {
		return nil, fmt.Errorf("tenants file %s: "+format+": %w", append(append([]any{file}, a...), sandbox.ErrInvalid)...)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f tenantsFile
	if err := dec.Decode(&f); err != nil {
		return bad("%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad("more than one JSON value")
	}
	if f.Schema != TenantsSchema {
		return bad("schema %q, want %q", f.Schema, TenantsSchema)
	}
	if len(f.Tenants) == 0 {
		return bad("no tenants")
	}
	t := &tenantTable{file: file, tenants: f.Tenants, byUID: map[uint32]caller{}, byGID: map[uint32]caller{}, bySubject: map[string]caller{},
		byNATS: map[string]caller{}}
	names := map[string]bool{}
	for i := range f.Tenants {
		e := &f.Tenants[i]
		entry := fmt.Sprintf("tenants[%d] (%q)", i, e.Name)
		switch {
		case e.Name == "" || len(e.Name) > 128 || bytes.ContainsAny([]byte(e.Name), "\x00\n"):
			return bad("%s: name must be 1 to 128 characters without NUL or newline", entry)
		case names[e.Name]:
			return bad("%s: name given twice", entry)
		case len(e.Identities) == 0:
			return bad("%s: no identities: nobody would act for this tenant", entry)
		case e.Quota.MaxJobs < 0:
			return bad("%s: quota.max_jobs %d is negative", entry, e.Quota.MaxJobs)
		case e.Quota.MaxUploadBytes < 0:
			return bad("%s: quota.max_upload_bytes %d is negative", entry, e.Quota.MaxUploadBytes)
		case e.Quota.MaxBlobBytes < 0:
			return bad("%s: quota.max_blob_bytes %d is negative", entry, e.Quota.MaxBlobBytes)
		}
		names[e.Name] = true
		for _, l := range limitFields(e.Quota.MaxLimits) {
			if l.value < 0 {
				return bad("%s: quota.max_limits.%s %d is negative", entry, l.name, l.value)
			}
		}
		for k, id := range e.Identities {
			if err := t.add(e, id); err != nil {
				return bad("%s: identities[%d]: %v", entry, k, err)
			}
		}
	}
	ts := &Tenants{}
	ts.cur.Store(t)
	return ts, nil
}

// Reload replaces t's tenants with those of data, the file t was read
// from as it is now (sandboxd serve reads it again on SIGHUP). A file
// that does not decode changes nothing: the error names the file, and
// the tenants read before stay. Jobs keep the owner their records name,
// and a request under way its tenant.
func (t *Tenants) Reload(data []byte) error {
	next, err := ParseTenants(t.File(), data)
	if err != nil {
		return err
	}
	t.cur.Store(next.cur.Load())
	t.mu.Lock()
	hooks := slices.Clone(t.reloaded)
	t.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	return nil
}

// OnReload calls f after each Reload that took.
func (t *Tenants) OnReload(f func()) {
	t.mu.Lock()
	t.reloaded = append(t.reloaded, f)
	t.mu.Unlock()
}

// add maps one identity entry's uids, gids and subjects to its tenant.
func (t *tenantTable) add(e *Tenant, id TenantIdentity) error {
	if !slices.Contains([]Role{RoleReader, RoleSubmitter, RoleAdmin}, id.Role) {
		return fmt.Errorf("role %q is not reader, submitter or admin", id.Role)
	}
	if len(id.UIDs)+len(id.GIDs)+len(id.Subjects)+len(id.NATSUsers) == 0 {
		return errors.New("no uids, gids, subjects or nats_users")
	}
	c := caller{Tenant: e, Role: id.Role}
	for _, u := range id.UIDs {
		if o, ok := t.byUID[u]; ok {
			return fmt.Errorf("uid %d is tenant %q's already", u, o.Name)
		}
		t.byUID[u] = c
	}
	for _, g := range id.GIDs {
		if o, ok := t.byGID[g]; ok {
			return fmt.Errorf("gid %d is tenant %q's already", g, o.Name)
		}
		t.byGID[g] = c
	}
	for _, s := range id.Subjects {
		if s == "" {
			return errors.New("an empty subject")
		}
		if o, ok := t.bySubject[s]; ok {
			return fmt.Errorf("subject %q is tenant %q's already", s, o.Name)
		}
		t.bySubject[s] = c
	}
	for _, u := range id.NATSUsers {
		if !validNATSName(u) {
			return fmt.Errorf("nats user %q is not 1-64 characters of [A-Za-z0-9_-]", u)
		}
		if o, ok := t.byNATS[u]; ok {
			return fmt.Errorf("nats user %q is tenant %q's already", u, o.Name)
		}
		t.byNATS[u] = c
	}
	return nil
}

// natsNameRE, at most 64 bytes (validNATSName): a counted repetition
// would compile into 64 copies of its class at every start.
var natsNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func validNATSName(s string) bool { return len(s) <= 64 && natsNameRE.MatchString(s) }

// CheckNATSName refuses a NATS user or account name the fleet's
// permissions file cannot carry as it is.
func CheckNATSName(name string) error {
	if !validNATSName(name) {
		return fmt.Errorf("%q is not 1-64 characters of [A-Za-z0-9_-]: %w", name, sandbox.ErrInvalid)
	}
	return nil
}

// List is the tenants as the file names them, in its order.
func (t *Tenants) List() []Tenant { return slices.Clone(t.cur.Load().tenants) }

// ByName is the tenant of that name, as a submitter of it (the fleet's
// jobs are queued by the tenant's submitters: the NATS servers let no
// one else publish on its subject).
func (t *Tenants) ByName(name string) (c caller, ok bool) {
	tab := t.cur.Load()
	for i := range tab.tenants {
		if tab.tenants[i].Name == name {
			return caller{Tenant: &tab.tenants[i], Role: RoleSubmitter}, true
		}
	}
	return caller{}, false
}

// File is the tenants file's name, for messages.
func (t *Tenants) File() string { return t.cur.Load().file }

// lookup is the tenant and role of an identity; ok is false for one that
// acts for no tenant.
func (t *Tenants) lookup(p peer) (c caller, ok bool) {
	tab := t.cur.Load()
	if p.unix {
		if c, ok := tab.byUID[p.uid]; ok {
			return c, true
		}
		if c, ok := tab.byGID[p.gid]; ok {
			return c, true
		}
		// Then the supplementary groups: those that name a tenant must
		// all name one tenant in one role; a peer in the groups of two
		// acts for neither (no guess between them).
		var found *caller
		for _, g := range p.groups {
			c, ok := tab.byGID[g]
			if !ok {
				continue
			}
			if found != nil && (found.Tenant != c.Tenant || found.Role != c.Role) {
				return caller{}, false
			}
			found = &c
		}
		if found != nil {
			return *found, true
		}
	}
	if p.subject != "" {
		c, ok := tab.bySubject[p.subject]
		return c, ok
	}
	return caller{}, false
}

// limitField is one of sandbox.Limits by its JSON name.
type limitField struct {
	name  string
	value int64
}

func limitFields(l sandbox.Limits) []limitField {
	return []limitField{
		{"wall_time_ms", l.WallTimeMS}, {"cpu_millis", l.CPUMillis}, {"memory_bytes", l.MemoryBytes},
		{"pids", l.Pids}, {"disk_bytes", l.DiskBytes}, {"output_bytes", l.OutputBytes},
		{"log_bytes", l.LogBytes}, {"file_count", l.FileCount}, {"open_files", l.OpenFiles},
		{"file_size_bytes", l.FileSize},
	}
}
