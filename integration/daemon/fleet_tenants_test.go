package daemon

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// fleetTenants is a tenants file of two submitting tenants, a reader of
// one and an admin, each acting through NATS users only.
const fleetTenants = `{"schema":"sandboxd.tenants/v1","tenants":[
 {"name":"team-a","identities":[{"role":"submitter","nats_users":["ci-a"]},{"role":"reader","nats_users":["dash-a"]}]},
 {"name":"team-b","identities":[{"role":"submitter","nats_users":["ci-b"]}]},
 {"name":"ops","identities":[{"role":"admin","nats_users":["ops"]}]}]}`

// tenantFleet is a one-node NATS server whose fleet account is what
// `sandboxd fleet permissions` writes from fleetTenants, every user's
// password its own name's; it returns the cluster and the tenants file.
func tenantFleet(t *testing.T) (*testharness.NATSCluster, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(file, []byte(fleetTenants), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary(t), "fleet", "permissions", "--tenants", file).Output()
	if err != nil {
		t.Fatalf("sandboxd fleet permissions: %v", err)
	}
	for _, u := range []string{"host", "ci-a", "dash-a", "ci-b", "ops"} {
		t.Setenv("SANDBOXD_NATS_PASSWORD_"+strings.ToUpper(strings.ReplaceAll(u, "-", "_")), u+"-pw")
	}
	return testharness.StartNATSWith(t, 1, string(out)), file
}

// userURL is c's URL with a user's name and password.
func userURL(c *testharness.NATSCluster, user string) string {
	return strings.Replace(c.URLs()[0], "nats://", "nats://"+user+":"+user+"-pw@", 1)
}

func openAs(t *testing.T, c *testharness.NATSCluster, user string, opt fleet.Options) *fleet.JetStream {
	t.Helper()
	opt.URLs, opt.Name, opt.Replicas = []string{userURL(c, user)}, t.Name()+"-"+user, 1
	opt.CallTimeout, opt.AckWait = 2*time.Second, 3*time.Second
	co, err := fleet.Open(ctxFor(t, 30*time.Second), opt)
	if err != nil {
		t.Fatalf("open the fleet as %s: %v", user, err)
	}
	t.Cleanup(co.Close)
	return co
}

// TestFleetTenantsAsGenerated runs `sandboxd fleet permissions` on a real
// server: each tenant queues, reads and watches its own jobs and blobs;
// the host takes the job as its tenant's; another tenant can neither
// read the record, the blob or the answers to the owner's reads, nor
// queue or write in its name (each refused by the server, and without
// effect); a reader reads and cannot submit; an admin reads every
// tenant's.
func TestFleetTenantsAsGenerated(t *testing.T) {
	c, _ := tenantFleet(t)
	ts := []string{"team-a", "team-b", "ops"}
	host := openAs(t, c, "host", fleet.Options{Setup: true, Tenants: ts})
	a := openAs(t, c, "ci-a", fleet.Options{Tenant: "team-a"})
	b := openAs(t, c, "ci-b", fleet.Options{Tenant: "team-b"})
	ctx := ctxFor(t, 2*time.Minute)

	// B sends first, on its own subject, messages with the ids A's
	// submit would have given its message: the stream's duplicate window
	// is the whole stream's, so A's job would not have been queued.
	job := jobWithoutEngine(t, "tenant-"+randHex(3), "true")
	bc, err := nats.Connect(userURL(c, "ci-b"), nats.CustomInboxPrefix("_INBOX_team-b"))
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	bjs, err := jetstream.New(bc)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"team-a/" + job.ID + "/" + job.Digest, job.ID + "/" + job.Digest} {
		if _, err := bjs.Publish(ctx, "sandboxd.jobs.team-b", []byte("not a job"), jetstream.WithMsgID(id)); err != nil {
			t.Fatalf("B queues on its own subject: %v", err)
		}
	}

	hidden := []byte("hidden tests of " + t.Name())
	layer := sandbox.DigestBytes(hidden)
	if err := a.PutBlob(ctx, layer, int64(len(hidden)), bytes.NewReader(hidden)); err != nil {
		t.Fatalf("A puts its bundle: %v", err)
	}
	if rec, err := a.Submit(ctx, job); err != nil || rec.State != fleet.StateQueued {
		t.Fatalf("A submits: %+v, %v", rec, err)
	}
	if got, err := a.Record(ctx, job.ID); err != nil || got.Digest != job.Digest {
		t.Errorf("A reads its record: %+v, %v", got, err)
	}

	// B, through its own view: nothing of A's is there.
	if _, err := b.Record(ctx, job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("B reads A's job id: %v, want not found", err)
	}
	if _, err := fleet.NewRunner(b, sandbox.KeySet{}).Blob(ctx, layer, 1<<10); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("B reads A's bundle by its digest: %v, want not found", err)
	}
	// B, raw: every way at A's subjects is refused by the server.
	var mu sync.Mutex
	var violations []string
	nc, err := nats.Connect(userURL(c, "ci-b"), nats.CustomInboxPrefix("_INBOX_team-b"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	aKey := "$KV.sandboxd-jobs-team-a.job." + strings.ReplaceAll(job.ID, ".", "=")
	tries := []struct{ what, subject string }{
		{"read A's record", "$JS.API.DIRECT.GET.KV_sandboxd-jobs-team-a." + aKey},
		{"read A's record from its leader", "$JS.API.STREAM.MSG.GET.KV_sandboxd-jobs-team-a"},
		{"read the held marks from their leader", "$JS.API.STREAM.MSG.GET.KV_sandboxd-jobs"},
		{"write A's record", aKey},
		{"list A's record keys", "$JS.API.STREAM.INFO.KV_sandboxd-jobs-team-a"},
		{"list the fleet's own keys (held marks)", "$JS.API.STREAM.INFO.KV_sandboxd-jobs"},
		{"watch A's records", "$JS.API.CONSUMER.CREATE.KV_sandboxd-jobs-team-a.w.$KV.sandboxd-jobs-team-a.>"},
		{"roll up the fleet's own bucket", "$KV.sandboxd-jobs.job.x"},
		{"queue a job as A", "sandboxd.jobs.team-a"},
		{"queue a job with no tenant", "sandboxd.jobs"},
		{"open A's blob store", "$JS.API.STREAM.INFO.OBJ_sandboxd-blobs-team-a"},
		{"read A's blobs", "$JS.API.DIRECT.GET.OBJ_sandboxd-blobs-team-a.$O.sandboxd-blobs-team-a.M.x"},
		{"read A's blobs from their leader", "$JS.API.STREAM.MSG.GET.OBJ_sandboxd-blobs-team-a"},
		{"read A's blobs' chunks", "$JS.API.DIRECT.GET.OBJ_sandboxd-blobs-team-a"},
		{"read even its own blobs through a consumer", "$JS.API.CONSUMER.CREATE.OBJ_sandboxd-blobs-team-b.c.$O.sandboxd-blobs-team-b.C.x"},
		{"take a job from the queue", "$JS.API.CONSUMER.CREATE.SANDBOXD_JOBS.sandboxd-hosts"},
		{"mark a claim held", "$KV.sandboxd-jobs.held.h1.team-b.x"},
		{"beat as a host", "$KV.sandboxd-hosts.h1"},
	}
	canon, err := job.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, try := range tries {
		if err := nc.Publish(try.subject, canon); err != nil {
			t.Fatalf("%s: %v", try.what, err)
		}
	}
	for _, inbox := range []string{"_INBOX_team-a.>", "_INBOX.>"} {
		if _, err := nc.SubscribeSync(inbox); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server's word on each comes asynchronously: all of it is
	// waited for (a refusal it never sends fails below, after 10 s).
	var got string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		n := len(violations)
		got = strings.Join(violations, "\n")
		mu.Unlock()
		if n >= len(tries)+2 || time.Now().After(deadline) {
			break
		}
	}
	for _, try := range tries {
		if !strings.Contains(got, `Permissions Violation for Publish to "`+try.subject+`"`) {
			t.Errorf("B may %s (publish to %s): the server said no violation of it; it said:\n%s", try.what, try.subject, got)
		}
	}
	for _, inbox := range []string{"_INBOX_team-a.>", "_INBOX.>"} {
		if !strings.Contains(got, `Permissions Violation for Subscription to "`+inbox+`"`) {
			t.Errorf("B may subscribe to %s, the answers to other users' reads; the server said:\n%s", inbox, got)
		}
	}
	// What B's chunk reads need is granted (refused, a read would only
	// wait a call's timeout before the leader's gets: no read fails).
	if _, err := nc.Request("$JS.API.DIRECT.GET.OBJ_sandboxd-blobs-team-b", []byte(`{"seq":1,"next_by_subj":"$O.sandboxd-blobs-team-b.C.>"}`), 5*time.Second); err != nil {
		t.Errorf("B's direct get of its own blobs' chunks: %v, want an answer", err)
	}

	// B rolls up its own bucket (a publish with "Nats-Rollup: all"
	// purges the bucket it is in): its own records only.
	hostA, err := host.Tenant(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := hostA.Hold(ctx, "h0", job.ID); err != nil {
		t.Fatal(err)
	}
	roll := nats.NewMsg("$KV.sandboxd-jobs-team-b.job.z")
	roll.Header.Set("Nats-Rollup", "all")
	if _, err := bjs.PublishMsg(ctx, roll); err != nil {
		t.Fatalf("B rolls up its own bucket: %v", err)
	}

	// The host takes B's messages as B's (not jobs: refused) and A's job
	// as A's; nothing B tried is in the queue, A's record is as A wrote
	// it, and the host's mark is there.
	var d *fleet.Delivery
	for range 3 {
		if d, err = host.Next(ctx, 10*time.Second); err != nil || d.Tenant != "team-b" {
			break
		}
		if d.Err == nil {
			t.Errorf("B's message decoded as a job: %+v", d.Job)
		}
		d.Refuse()
	}
	if err != nil || d.Err != nil || d.Job.ID != job.ID || d.Tenant != "team-a" {
		t.Fatalf("the host takes A's job: %+v, %v", d, err)
	}
	d.Done(ctx)
	if held, err := host.Held(ctx, "h0"); err != nil || len(held) != 1 {
		t.Errorf("the host's mark after B's rollup: %+v, %v", held, err)
	}
	// A consumer a tenant may create on its own bucket names its deliver
	// subject in the request's body, which permissions cannot bound: one
	// delivering A's records on B's job subject queues nothing there.
	ac, err := nats.Connect(userURL(c, "ci-a"), nats.CustomInboxPrefix("_INBOX_team-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	push, err := ac.Request("$JS.API.CONSUMER.CREATE.KV_sandboxd-jobs-team-a.into-b",
		[]byte(`{"stream_name":"KV_sandboxd-jobs-team-a","config":{"name":"into-b","deliver_subject":"sandboxd.jobs.team-b","deliver_policy":"all","ack_policy":"none"}}`), 5*time.Second)
	if err != nil {
		t.Fatalf("A creates a push consumer: %v", err)
	}
	t.Logf("A's push consumer into B's job subject: %s", push.Data)
	time.Sleep(time.Second)
	if d, err := host.Next(ctx, 2*time.Second); !errors.Is(err, fleet.ErrNoMessage) {
		t.Errorf("the queue after B's tries and A's push consumer: %+v, %v, want nothing", d, err)
	}
	rec, err := hostA.Record(ctx, job.ID)
	if err != nil || rec.State != fleet.StateQueued || rec.Digest != job.Digest {
		t.Errorf("A's record as the host reads it: %+v, %v", rec, err)
	}
	if held, err := host.Held(ctx, "h1"); err != nil || len(held) != 0 {
		t.Errorf("held by h1 after B's try: %+v, %v, want none", held, err)
	}
	if hosts, err := host.Hosts(ctx); err != nil || len(hosts) != 0 {
		t.Errorf("hosts after B's beat: %+v, %v, want none", hosts, err)
	}
	hostB, err := host.Tenant(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostB.Record(ctx, job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("B's namespace holds A's job id: %v", err)
	}
	// A host's marks are per tenant; Held lists each with its tenant.
	if err := hostA.Hold(ctx, "h1", job.ID); err != nil {
		t.Fatal(err)
	}
	if held, err := host.Held(ctx, "h1"); err != nil || len(held) != 1 || held[0] != (fleet.Claim{Tenant: "team-a", ID: job.ID}) {
		t.Errorf("held by h1: %+v, %v, want A's job", held, err)
	}
	if err := hostA.Release(ctx, "h1", job.ID); err != nil {
		t.Fatal(err)
	}

	// A watches the host's claim of it.
	rec.State, rec.Host = fleet.StateClaimed, "h1"
	if _, err := hostA.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Watch(ctx, job.ID, func(r fleet.Record) bool { return r.State == fleet.StateClaimed }); err != nil || got.Host != "h1" {
		t.Errorf("A watches its job claimed: %+v, %v", got, err)
	}

	// A reader of A reads and cannot submit; an admin reads A's.
	reader := openAs(t, c, "dash-a", fleet.Options{Tenant: "team-a"})
	if got, err := reader.Record(ctx, job.ID); err != nil || got.Host != "h1" {
		t.Errorf("A's reader reads A's record: %+v, %v", got, err)
	}
	if _, err := reader.Submit(ctx, jobWithoutEngine(t, "tenant-"+randHex(3), "true")); !errors.Is(err, fleet.ErrDenied) {
		t.Errorf("A's reader submits a job: %v, want refused by the permissions", err)
	}
	// B's user acting for A is refused at once, saying so (not a fleet
	// that does not answer, tried again until the caller gives up).
	began := time.Now()
	_, err = fleet.Open(ctxFor(t, 30*time.Second), fleet.Options{URLs: []string{userURL(c, "ci-b")}, Name: t.Name() + "-b-as-a",
		Tenant: "team-a", CallTimeout: 2 * time.Second})
	if !errors.Is(err, fleet.ErrDenied) || !strings.Contains(err.Error(), "Permissions Violation") || time.Since(began) > 10*time.Second {
		t.Errorf("B's user opens the fleet as team-a: %v after %v, want refused by the permissions within seconds", err, time.Since(began).Round(time.Millisecond))
	}
	admin := openAs(t, c, "ops", fleet.Options{Tenant: "team-a", InboxPrefix: "_INBOX_ops"})
	if got, err := admin.Record(ctx, job.ID); err != nil || got.Digest != job.Digest {
		t.Errorf("the admin reads A's record: %+v, %v", got, err)
	}
	if got, err := fleet.NewRunner(admin, sandbox.KeySet{}).Blob(ctx, layer, 1<<10); err != nil || !bytes.Equal(got, hidden) {
		t.Errorf("the admin reads A's blob: %q, %v", got, err)
	}

	// A tenants file whose names cannot be a fleet's is refused by the
	// generator, naming the tenant.
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(strings.Replace(fleetTenants, `"name":"ops"`, `"name":"ops team"`, 1)), 0o600)
	out, err := exec.Command(binary(t), "fleet", "permissions", "--tenants", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `tenant "ops team"`) {
		t.Errorf("permissions of a tenant named \"ops team\": %v %s, want an error naming it", err, out)
	}
}

// TestFleetTenantCannotStageAnothersBundle is the hidden-tests read-out
// on a fleet: tenant A's job runs with its bundle on a host, which then
// holds the bundle's bytes; tenant B, knowing the digest, queues a job
// staging it. The host takes an input as B's only from B's own store in
// the fleet (and admits it as B's, whose uploads it must be), so B's job
// ends error, never runs, and nothing of A's is in its result; B's own
// upload of the same bytes is B's. Before tenants had stores of their
// own, any submitter could read the bundle from the fleet's one store by
// its digest, and a host ran any fleet job whose inputs it held.
func TestFleetTenantCannotStageAnothersBundle(t *testing.T) {
	c, tenants := tenantFleet(t)
	d := newDaemon(t, "--fleet", userURL(c, "host"), "--fleet-replicas", "1", "--tenants", tenants,
		"--fleet-ack-wait", "3s", "--fleet-call-timeout", "3s", "--pool", "0")
	d.start()
	created := creationsOf(d)
	a := fleet.NewRunner(openAs(t, c, "ci-a", fleet.Options{Tenant: "team-a"}), d.keys)
	b := fleet.NewRunner(openAs(t, c, "ci-b", fleet.Options{Tenant: "team-b"}), d.keys)
	ctx := ctxFor(t, 3*time.Minute)

	layer := env.PutTree(t, map[string]string{"tests/": "", "tests/hidden_test.py": "assert answer() == 42 # " + t.Name()})
	if err := a.PutBlob(ctx, layer, env.Blob(t, layer)); err != nil {
		t.Fatalf("A puts its bundle: %v", err)
	}
	stage := func(script string) sandbox.Job {
		return env.NewJob(t, testharness.Sh(script), func(j *sandbox.Job) {
			j.Inputs = []sandbox.Input{{Name: "bundle", Digest: layer, Path: sandbox.BundlePath}}
		})
	}
	job := stage("cat /bundle/tests/hidden_test.py")
	if _, err := a.Submit(ctx, job); err != nil {
		t.Fatalf("A submits: %v", err)
	}
	sr, err := a.Wait(ctx, job)
	if err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("A's job: %v %+v, want succeeded", err, sr.Result)
	}
	if out, err := a.Blob(ctx, sr.Result.Stdout.Digest, 1<<20); err != nil || !strings.Contains(string(out), "answer() == 42") {
		t.Fatalf("A reads its job's stdout: %q %v", out, err)
	}
	if _, err := b.Status(ctx, job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("B's status of A's job: %v, want not found", err)
	}

	steal := stage("cat /bundle/tests/hidden_test.py")
	if _, err := b.Submit(ctx, steal); err != nil {
		t.Fatalf("B submits: %v", err)
	}
	res, err := b.Wait(ctx, steal)
	if err != nil {
		t.Fatalf("B waits: %v", err)
	}
	if res.Result.Status != sandbox.StatusError || !strings.Contains(res.Result.Cause, "input "+layer+" is not in the fleet's blob store") {
		t.Errorf("B's job staging A's bundle: %s %q, want error: the input is not in the fleet's blob store", res.Result.Status, res.Result.Cause)
	}
	if n := created()[steal.ID]; n != 0 {
		t.Errorf("B's job staging A's bundle: %d containers created, want none", n)
	}
	// B's own job with its own upload of the same bytes runs: a tenant
	// holds what it uploaded.
	if err := b.PutBlob(ctx, layer, env.Blob(t, layer)); err != nil {
		t.Fatal(err)
	}
	own := stage("test -f /bundle/tests/hidden_test.py")
	if _, err := b.Submit(ctx, own); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Wait(ctx, own); err != nil || res.Result.Status != sandbox.StatusSucceeded {
		t.Errorf("B's job with its own upload: %v %+v, want succeeded", err, res.Result)
	}
	d.stop()
}

// TestFleetCLI runs `sandboxd submit|wait|status --fleet` as a tenant's
// user and `sandboxd fleet status` as the hosts': the job runs on the
// host, its result verifies with the host's key, another tenant's user
// does not find it, and one acting for a tenant not its own is refused
// by the servers' permissions, saying so.
func TestFleetCLI(t *testing.T) {
	c, tenants := tenantFleet(t)
	d := newDaemon(t, "--fleet", userURL(c, "host"), "--fleet-replicas", "1", "--tenants", tenants,
		"--fleet-ack-wait", "3s", "--fleet-call-timeout", "3s", "--pool", "0")
	d.start()
	dir := t.TempDir()
	pub := filepath.Join(dir, "pub.pem")
	layer := env.PutTree(t, map[string]string{"data.txt": "fleet cli " + t.Name()})
	layerFile, jobFile := filepath.Join(dir, "layer.tar"), filepath.Join(dir, "job.json")
	job := env.NewJob(t, testharness.Sh("cat /bundle/data.txt"), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: layer, Path: sandbox.BundlePath}}
	})
	canon, err := job.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{pub: pubPEM, layerFile: env.Blob(t, layer), jobFile: canon} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		ctx := ctxFor(t, 2*time.Minute)
		cmd := exec.CommandContext(ctx, binary(t), args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("sandboxd %v: %v", args, err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	as := func(user, tenant string) []string {
		return []string{"--fleet", userURL(c, user), "--fleet-tenant", tenant, "--fleet-call-timeout", "2s"}
	}
	args := func(cmd string, flags []string, rest ...string) []string {
		return append(append([]string{cmd}, flags...), rest...)
	}
	if code, out, errOut := run(args("submit", as("ci-a", "team-a"), "--key", pub, "--blob", layerFile, jobFile)...); code != 0 || !strings.Contains(out, `"payload"`) {
		t.Fatalf("submit as A: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := run(args("wait", as("ci-a", "team-a"), "--key", pub, jobFile)...); code != 0 || !strings.Contains(errOut, "job "+job.ID+": succeeded") {
		t.Errorf("wait as A: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := run(args("status", as("ci-a", "team-a"), "--json", job.ID)...); code != 0 || !strings.Contains(out, `"ended"`) || !strings.Contains(out, d.name) {
		t.Errorf("status as A: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := run(args("status", as("ci-b", "team-b"), job.ID)...); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("status of A's job as B: exit %d\n%s\n%s\nwant not found", code, out, errOut)
	}
	if code, out, errOut := run(args("submit", as("ci-b", "team-a"), "--key", pub, jobFile)...); code != 3 || !strings.Contains(errOut, "refused by the fleet's NATS permissions") {
		t.Errorf("submit as B acting for A: exit %d\n%s\n%s, want exit 3, refused by the permissions", code, out, errOut)
	}
	code, out, errOut := run("fleet", "status", "--fleet", userURL(c, "host"), "--json")
	if code != 0 || !strings.Contains(out, `"name":"`+d.name+`"`) || !strings.Contains(out, `"alive":true`) {
		t.Errorf("fleet status: exit %d\n%s\n%s\nwant %s alive", code, out, errOut, d.name)
	}
	d.stop()
}

// A tenant with no max_blob_bytes gets an equal share of the fleet's
// --fleet-blob-bytes: a share under --max-blob-bytes, which could not hold
// an upload the host takes, is refused when the host starts, naming the
// tenant and the flags; a share that holds it starts.
func TestFleetTenantShareHoldsTheLargestUpload(t *testing.T) {
	c, tenants := tenantFleet(t)
	flags := []string{"--fleet", userURL(c, "host"), "--fleet-replicas", "1", "--tenants", tenants,
		"--fleet-call-timeout", "3s", "--pool", "0", "--max-blob-bytes", "1048576"}
	logs := newDaemon(t, append(flags, "--fleet-blob-bytes", "2097152")...).startFails(time.Minute)
	for _, want := range []string{"team-a", "has no max_blob_bytes", "--fleet-blob-bytes 2097152 among 3 tenants, 699050 bytes", "--max-blob-bytes 1048576"} {
		if !strings.Contains(logs, want) {
			t.Errorf("a share of 699050 bytes: %s\nwant an error saying %q", tail(logs, 5), want)
		}
	}
	d := newDaemon(t, append(flags, "--fleet-blob-bytes", "3145728")...)
	d.start()
	d.stop()
}
