package fleet

import (
	"slices"
)

// Permissions are the subjects a NATS user of the fleet may publish and
// subscribe to (a NATS user's "permissions": allow lists; nothing else
// is allowed). Hosts are given the whole account, and no Permissions.
type Permissions struct {
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
}

// TenantPermissions are those of a user acting for tenant: with submit,
// it queues the tenant's jobs, creates (and can write) its records and
// puts its blobs; it reads and watches its records and reads its blobs;
// it receives answers on the tenant's inbox prefix only (Options
// .InboxPrefix), never another tenant's. read names more tenants whose
// records and blobs it may read, and whose inbox prefixes it may use
// (an admin's: it opens the fleet as the tenant it reads). Nothing here lets it take
// a job from the queue, mark a claim held, beat as a host, or see
// another tenant's records, blobs or answers.
func TenantPermissions(tenant string, submit bool, read ...string) Permissions {
	p := Permissions{
		Publish: []string{
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO.KV_" + hostBucket,
			"$JS.FC.>",
		},
	}
	for _, t := range append([]string{tenant}, read...) {
		p.Subscribe = append(p.Subscribe, "_INBOX_"+t+".>")
		for _, stream := range []string{"KV_" + recordBucketOf(t), "OBJ_" + blobBucketOf(t)} {
			p.Publish = append(p.Publish,
				"$JS.API.STREAM.INFO."+stream,
				"$JS.API.DIRECT.GET."+stream+".>",
			)
		}
		// Watchers of its records; blobs are read by gets (Blob), never
		// through a consumer: a chunk by a direct get that names it in its
		// body.
		records := "KV_" + recordBucketOf(t)
		p.Publish = append(p.Publish, "$JS.API.CONSUMER.CREATE."+records+".>", "$JS.API.CONSUMER.DELETE."+records+".>",
			"$JS.API.DIRECT.GET.OBJ_"+blobBucketOf(t))
		// Gets that only a stream's leader answers: a record as last
		// written (Record), a blob's metadata and the chunks a replica
		// lacks (Blob). Each of these streams holds only t's records or
		// blobs.
		p.Publish = append(p.Publish, "$JS.API.STREAM.MSG.GET.KV_"+recordBucketOf(t), "$JS.API.STREAM.MSG.GET.OBJ_"+blobBucketOf(t))
	}
	if submit {
		blobs := blobBucketOf(tenant)
		p.Publish = append(p.Publish,
			jobsSubjectOf(tenant),
			"$KV."+recordBucketOf(tenant)+".>",
			"$O."+blobs+".C.>", "$O."+blobs+".M.>",
		)
	}
	slices.Sort(p.Publish)
	p.Publish = slices.Compact(p.Publish)
	slices.Sort(p.Subscribe)
	p.Subscribe = slices.Compact(p.Subscribe)
	return p
}
