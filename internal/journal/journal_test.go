package journal

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sandboxd/sandboxd/sandbox"
)

func testJob(t *testing.T, id string, argv ...string) (sandbox.Job, []byte) {
	t.Helper()
	j := sandbox.Job{
		Schema: sandbox.JobSchema, ID: id, Image: "sha256:" + string(bytes.Repeat([]byte("a"), 64)),
		Argv: argv, WorkDir: sandbox.WorkPath, Limits: sandbox.DefaultLimits(),
		Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
	}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	c, err := j.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return j, c
}

func TestAcceptIsIdempotentByDigest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	jr, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	job, canon := testJob(t, "a1", "true")
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec, existing, err := jr.Accept(job, canon, []byte("receipt-1"), at)
	if err != nil || existing {
		t.Fatalf("first accept: existing=%v err=%v, want false nil", existing, err)
	}
	if rec.State != Accepted {
		t.Errorf("got state %s, want %s", rec.State, Accepted)
	}
	rec2, existing, err := jr.Accept(job, canon, []byte("receipt-2"), at.Add(time.Hour))
	if err != nil || !existing {
		t.Fatalf("second accept: existing=%v err=%v, want true nil", existing, err)
	}
	if string(rec2.Receipt) != "receipt-1" {
		t.Errorf("got receipt %q, want the first one", rec2.Receipt)
	}
	other, ocanon := testJob(t, "a1", "false")
	if _, _, err := jr.Accept(other, ocanon, []byte("receipt-3"), at); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("other digest: got %v, want ErrConflict", err)
	}
	// Durable across a reopen, and the conflict changed nothing.
	jr.Close()
	jr, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer jr.Close()
	got, err := jr.Get("a1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != job.Digest || string(got.Receipt) != "receipt-1" || !bytes.Equal(got.Job, canon) {
		t.Errorf("after reopen got %+v, want the first accept", got)
	}
	if _, err := got.DecodeJob(); err != nil {
		t.Errorf("stored job does not decode: %v", err)
	}
	if _, err := jr.Get("nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("missing job: got %v, want ErrNotFound", err)
	}
}

func TestTransitions(t *testing.T) {
	at := time.Now()
	steps := map[string]func(j *Journal, id string) error{
		"dispatched": func(j *Journal, id string) error { _, err := j.Dispatched(id); return err },
		"created":    func(j *Journal, id string) error { _, err := j.Created(id, "c1"); return err },
		"started":    func(j *Journal, id string) error { _, err := j.Started(id, at); return err },
		"finished": func(j *Journal, id string) error {
			_, err := j.Finish(id, sandbox.StatusSucceeded, []byte("env"), at)
			return err
		},
		"uncertain": func(j *Journal, id string) error {
			_, err := j.Finish(id, sandbox.StatusUncertain, []byte("env"), at)
			return err
		},
	}
	tests := []struct {
		name  string
		steps []string
		final State
		ok    bool
	}{
		{"full life", []string{"dispatched", "created", "started", "finished"}, Finished, true},
		{"dispatched twice", []string{"dispatched", "dispatched"}, Dispatched, false},
		{"created twice", []string{"dispatched", "created", "created"}, Created, false},
		{"uncertain after accept", []string{"uncertain"}, Uncertain, true},
		{"uncertain after create", []string{"dispatched", "created", "uncertain"}, Uncertain, true},
		{"nothing after finished", []string{"dispatched", "finished", "started"}, Finished, false},
		{"no going back", []string{"dispatched", "created", "started", "created"}, Started, false},
		{"finished twice", []string{"finished", "uncertain"}, Finished, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			jr, err := Open(filepath.Join(t.TempDir(), "j.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer jr.Close()
			job, canon := testJob(t, "t"+string(rune('a'+i)), "true")
			if _, _, err := jr.Accept(job, canon, []byte("r"), at); err != nil {
				t.Fatal(err)
			}
			var last error
			for _, s := range tc.steps {
				if err := steps[s](jr, job.ID); err != nil {
					last = err
				}
			}
			if (last == nil) != tc.ok {
				t.Fatalf("got error %v, want ok=%v", last, tc.ok)
			}
			if !tc.ok && !errors.Is(last, ErrTransition) {
				t.Errorf("got %v, want ErrTransition", last)
			}
			rec, _ := jr.Get(job.ID)
			if rec.State != tc.final {
				t.Errorf("got state %s, want %s", rec.State, tc.final)
			}
		})
	}
}

// A job a restart proved never ran goes back to accepted, unbound, and
// the journal counts it (durably: a second restart before its run still
// knows an earlier process's create may land under its name).
func TestNotRunIsCountedDurably(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	jr, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	job, canon := testJob(t, "requeued", "true")
	if _, _, err := jr.Accept(job, canon, []byte("r"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := jr.NotRun(job.ID); !errors.Is(err, ErrTransition) {
		t.Fatalf("not run while accepted: %v, want ErrTransition", err)
	}
	for range 2 {
		if _, err := jr.Dispatched(job.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := jr.Created(job.ID, "c1"); err != nil {
			t.Fatal(err)
		}
		if _, err := jr.NotRun(job.ID); err != nil {
			t.Fatal(err)
		}
	}
	jr.Close()
	if jr, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer jr.Close()
	rec, err := jr.Get(job.ID)
	if err != nil || rec.State != Accepted || rec.ContainerID != "" || rec.Requeued != 2 {
		t.Fatalf("after two proofs and a reopen: %s, container %q, requeued %d, %v; want accepted, unbound, 2", rec.State, rec.ContainerID, rec.Requeued, err)
	}
}

// The order of acceptance is the journal's own, not the clock's: a clock
// stepped back between two acceptances does not reorder them, a reopen
// keeps it, and an idempotent resubmission keeps its place.
func TestAcceptanceOrderIsTheJournals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	jr, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ids := []string{"o-c", "o-a", "o-b"} // accepted in this order, each an hour "earlier"
	for i, id := range ids {
		job, canon := testJob(t, id, "true")
		if _, _, err := jr.Accept(job, canon, []byte("r"), at.Add(-time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	job, canon := testJob(t, "o-c", "true")
	if _, existing, err := jr.Accept(job, canon, []byte("r"), at.Add(time.Hour)); err != nil || !existing {
		t.Fatalf("resubmit: existing=%v err=%v, want true nil", existing, err)
	}
	jr.Close()
	if jr, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer jr.Close()
	recs, err := jr.List()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(recs, AcceptanceOrder)
	var got []string
	for _, r := range recs {
		got = append(got, r.ID)
	}
	if !slices.Equal(got, ids) {
		t.Errorf("got acceptance order %v, want %v", got, ids)
	}
}

func TestAcceptanceOrderOfRecordsWithoutSeq(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old1 := Record{ID: "z", AcceptedAt: at}
	old2 := Record{ID: "y", AcceptedAt: at.Add(time.Second)}
	seq1 := Record{ID: "x", Seq: 1, AcceptedAt: at.Add(-time.Hour)}
	recs := []Record{seq1, old2, old1}
	slices.SortFunc(recs, AcceptanceOrder)
	if got := []string{recs[0].ID, recs[1].ID, recs[2].ID}; !slices.Equal(got, []string{"z", "y", "x"}) {
		t.Errorf("got %v, want records of an older journal (by time) before numbered ones", got)
	}
}

// A job's tenant is kept with its record, and a blob's readers across a
// reopen; a record written before tenants were kept reads as no tenant's.
func TestTenantsAndBlobGrantsAreDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	jr, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	job, canon := testJob(t, "t1", "true")
	if _, _, err := jr.AcceptAs("team-a", job, canon, []byte("r"), time.Now()); err != nil {
		t.Fatal(err)
	}
	old, oldCanon := testJob(t, "t0", "true")
	if _, _, err := jr.Accept(old, oldCanon, []byte("r"), time.Now()); err != nil {
		t.Fatal(err)
	}
	// Another tenant's acceptance of the id finds the record as it is.
	if rec, existing, err := jr.AcceptAs("team-b", job, canon, []byte("r2"), time.Now()); err != nil || !existing || rec.Tenant != "team-a" {
		t.Fatalf("second accept: %v existing=%v tenant=%q, want team-a's record", err, existing, rec.Tenant)
	}
	d := sandbox.DigestBytes([]byte("layer"))
	if err := jr.GrantBlobs("team-a", d); err != nil {
		t.Fatal(err)
	}
	jr.Close()
	if jr, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer jr.Close()
	if rec, err := jr.Get("t1"); err != nil || rec.Tenant != "team-a" {
		t.Errorf("t1 after reopen: %v tenant %q, want team-a", err, rec.Tenant)
	}
	if rec, err := jr.Get("t0"); err != nil || rec.Tenant != "" {
		t.Errorf("t0: %v tenant %q, want none", err, rec.Tenant)
	}
	for _, tc := range []struct {
		tenant, d string
		want      bool
	}{{"team-a", d, true}, {"team-b", d, false}, {"", d, false}, {"team-a", sandbox.DigestBytes([]byte("other")), false}, {"team-a\x00" + d, "", false}} {
		if got, err := jr.BlobGranted(tc.tenant, tc.d); err != nil || got != tc.want {
			t.Errorf("BlobGranted(%q, %q): got %v %v, want %v", tc.tenant, tc.d, got, err, tc.want)
		}
	}
}

// A tenant's granted blobs are read from an index by tenant (not every
// grant of every tenant); a journal from before the index has it built
// at Open, and pruning a grant removes it from both.
func TestGrantedBlobsByTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	jr, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := sandbox.DigestBytes([]byte("a1")), sandbox.DigestBytes([]byte("a2")), sandbox.DigestBytes([]byte("b1"))
	// "team" is a prefix of "team-a": only its own grants are its.
	for _, g := range []struct{ tenant, d string }{{"team-a", a1}, {"team-a", a2}, {"team-b", b1}, {"team", b1}} {
		if err := jr.GrantBlobs(g.tenant, g.d); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, want map[string][]string) {
		t.Helper()
		for tenant, ds := range want {
			got, err := jr.GrantedBlobs(tenant)
			slices.Sort(got)
			slices.Sort(ds)
			if err != nil || !slices.Equal(got, ds) {
				t.Errorf("%s: GrantedBlobs(%q) = %v %v, want %v", when, tenant, got, err, ds)
			}
		}
	}
	check("granted", map[string][]string{"team-a": {a1, a2}, "team-b": {b1}, "team": {b1}, "nobody": nil})

	// A journal written before the index: the index goes, and Open
	// builds it again from the grants.
	if err := jr.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketTenantBlobs) }); err != nil {
		t.Fatal(err)
	}
	jr.Close()
	if jr, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer jr.Close()
	check("reopened without the index", map[string][]string{"team-a": {a1, a2}, "team-b": {b1}, "team": {b1}})

	if n, err := jr.PruneGrants(func(d string) bool { return d != a1 && d != b1 }); err != nil || n != 3 {
		t.Fatalf("prune: %d %v, want 3 grants removed", n, err)
	}
	check("pruned", map[string][]string{"team-a": {a2}, "team-b": nil, "team": nil})
}

// BenchmarkGrantedBlobsAmongOthers lists one tenant's 100 grants in a
// journal of 100 tenants' (10,000 grants):
// go test -run - -bench GrantedBlobsAmongOthers ./internal/journal
func BenchmarkGrantedBlobsAmongOthers(b *testing.B) {
	jr, err := Open(filepath.Join(b.TempDir(), "journal.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer jr.Close()
	for i := range 100 {
		var ds []string
		for k := range 100 {
			ds = append(ds, sandbox.DigestBytes([]byte{byte(i), byte(k)}))
		}
		if err := jr.GrantBlobs(fmt.Sprintf("tenant-%03d", i), ds...); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if ds, err := jr.GrantedBlobs("tenant-042"); err != nil || len(ds) != 100 {
			b.Fatal(len(ds), err)
		}
	}
}
