package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandboxd/sandboxd/sandbox"
)

// askedObjects is an object store, and its stream's leader, that has
// nothing and counts what it is asked.
type askedObjects struct {
	jetstream.ObjectStore
	asked int
}

func (o *askedObjects) get(context.Context, string, msgGet) (storedMsg, error) {
	o.asked++
	return storedMsg{}, jetstream.ErrMsgNotFound
}

func (o *askedObjects) Put(context.Context, jetstream.ObjectMeta, io.Reader) (*jetstream.ObjectInfo, error) {
	o.asked++
	return nil, errors.New("put: the test's store takes nothing")
}

// The empty content (most jobs' stdout or stderr) is never stored and is
// served without a read, checked against its digest; every other digest
// is still asked of the store, and one it lacks is not found.
func TestEmptyBlobIsNeitherStoredNorRead(t *testing.T) {
	if got := sandbox.DigestBytes(nil); got != EmptyDigest {
		t.Fatalf("EmptyDigest = %s, the digest of no bytes is %s", EmptyDigest, got)
	}
	ctx := context.Background()
	other := sandbox.DigestBytes([]byte("stdout of a job"))
	tests := []struct {
		name      string
		call      func(f *JetStream) error
		wantErr   error // nil: none
		wantAsked int
	}{
		{"put the empty blob", func(f *JetStream) error { return f.PutBlob(ctx, EmptyDigest, 0, strings.NewReader("")) }, nil, 0},
		{"put bytes under the empty digest", func(f *JetStream) error { return f.PutBlob(ctx, EmptyDigest, 0, strings.NewReader("x")) }, sandbox.ErrInvalid, 0},
		{"put the empty blob with a size", func(f *JetStream) error { return f.PutBlob(ctx, EmptyDigest, 1, strings.NewReader("")) }, sandbox.ErrInvalid, 0},
		{"read the empty blob", func(f *JetStream) error {
			rc, err := f.Blob(ctx, EmptyDigest)
			if err != nil {
				return err
			}
			defer rc.Close()
			b, err := io.ReadAll(rc) // checked against its digest at EOF
			if err == nil && len(b) != 0 {
				err = errors.New("got bytes")
			}
			return err
		}, nil, 0},
		{"read the empty blob through a runner", func(f *JetStream) error {
			b, err := NewRunner(f, sandbox.KeySet{}).Blob(ctx, EmptyDigest, 0)
			if err == nil && len(b) != 0 {
				err = errors.New("got bytes")
			}
			return err
		}, nil, 0},
		{"read a missing blob", func(f *JetStream) error { _, err := f.Blob(ctx, other); return err }, sandbox.ErrNotFound, 1},
		{"read a missing blob through a runner", func(f *JetStream) error { _, err := NewRunner(f, sandbox.KeySet{}).Blob(ctx, other, 1<<10); return err }, sandbox.ErrNotFound, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := &askedObjects{}
			f := &JetStream{blobs: store, leader: store, opt: Options{CallTimeout: time.Second}}
			err := tt.call(f)
			if (tt.wantErr == nil && err != nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("got %v, want %v", err, tt.wantErr)
			}
			if store.asked != tt.wantAsked {
				t.Errorf("the store was asked %d times, want %d", store.asked, tt.wantAsked)
			}
		})
	}
}

// laggingRecords is a key-value bucket whose watchers deliver every
// write; read is the record as a replica that has not applied the last
// write gives it (as a direct get may).
type laggingRecords struct {
	jetstream.KeyValue
	read    Record   // what a read answers
	written []Record // what a watcher delivers, in order
	watches int
}

type entry struct {
	key string
	rec Record
}

func (e entry) Bucket() string                  { return recordBucket }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { b, _ := json.Marshal(e.rec); return b }
func (e entry) Revision() uint64                { return e.rec.Revision }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

type watcher struct{ updates chan jetstream.KeyValueEntry }

func (w watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }
func (w watcher) Stop() error                             { return nil }

func (l *laggingRecords) Watch(ctx context.Context, key string, _ ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	l.watches++
	w := watcher{make(chan jetstream.KeyValueEntry, len(l.written)+1)}
	for _, r := range l.written {
		w.updates <- entry{key, r}
	}
	w.updates <- nil // the end of the values there at the start
	go func() { <-ctx.Done(); close(w.updates) }()
	return w, nil
}

// Watch takes the record its watcher delivers, not a read made after it:
// a read answered by a lagging replica gave the record before the write,
// and the wait took a second longer (or, for a watcher that began after
// the write, until the replica caught up).
func TestWatchTakesTheWatchersRecord(t *testing.T) {
	claimed := Record{Schema: RecordSchema, ID: "j1", Digest: EmptyDigest, State: StateClaimed, Host: "h1", Revision: 2}
	withReceipt := claimed
	withReceipt.Receipt, withReceipt.Revision = []byte("receipt"), 3
	ended := withReceipt
	ended.State, ended.Result, ended.Revision = StateEnded, []byte("result"), 4
	records := &laggingRecords{read: claimed, written: []Record{withReceipt, ended}}
	f := &JetStream{records: records, opt: Options{CallTimeout: time.Second}}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	read := func(context.Context, string) (Record, error) { return records.read, nil }
	got, err := f.watch(ctx, "j1", func(r Record) bool { return r.State == StateEnded }, read)
	if err != nil || got.Revision != ended.Revision {
		t.Fatalf("watch for the end: revision %d, %v; want revision %d within 500ms (reads answer revision %d)", got.Revision, err, ended.Revision, claimed.Revision)
	}
	if records.watches != 1 {
		t.Errorf("%d watchers, want 1", records.watches)
	}
}

// chunkStream is a stream's leader holding messages at sequences.
type chunkStream map[uint64]storedMsg

func (s chunkStream) get(_ context.Context, _ string, g msgGet) (storedMsg, error) {
	var seqs []uint64
	for seq := range s {
		if seq >= g.Seq {
			seqs = append(seqs, seq)
		}
	}
	if len(seqs) == 0 {
		return storedMsg{}, jetstream.ErrMsgNotFound
	}
	return s[slices.Min(seqs)], nil
}

// A blob's chunks are read in order until its metadata's size; a store
// that has fewer bytes, or more, is an error, never a short or long blob.
func TestChunkReaderReadsTheSizeTheMetadataSays(t *testing.T) {
	gaps := chunkStream{3: {data: []byte("abc"), seq: 3}, 7: {data: []byte("de"), seq: 7}, 9: {data: []byte("f"), seq: 9}}
	// Asked ahead from 2, 3 and 4 after the first chunk: 3 and 4 find the
	// chunk at 5 (only the get asked from the sequence after the last
	// chunk read is taken).
	runs := chunkStream{1: {data: []byte("abc"), seq: 1}, 2: {data: []byte("def"), seq: 2}, 5: {data: []byte("ghi"), seq: 5}, 6: {data: []byte("j"), seq: 6}}
	for _, tt := range []struct {
		stream  chunkStream
		size    uint64
		want    string
		wantErr string
	}{
		{gaps, 6, "abcdef", ""},
		{gaps, 4, "", "more bytes"},
		{gaps, 8, "abcdef", "2 bytes fewer"},
		{runs, 10, "abcdefghij", ""},
		{runs, 9, "abcdefghi", ""}, // the hash check (checkedReader) refuses it
	} {
		r := &chunkReader{ctx: context.Background(), leader: tt.stream, callTimeout: time.Second, left: tt.size}
		got, err := io.ReadAll(r)
		if tt.wantErr == "" && (err != nil || string(got) != tt.want) {
			t.Errorf("size %d: %q, %v; want %q", tt.size, got, err, tt.want)
		}
		if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("size %d: %q, %v; want an error saying %q", tt.size, got, err, tt.wantErr)
		}
	}
}

// failingGets fails every get.
type failingGets struct{ asked *atomic.Int32 }

func (f failingGets) get(context.Context, string, msgGet) (storedMsg, error) {
	f.asked.Add(1)
	return storedMsg{}, errors.New("no answer")
}

// A chunk the replica that answers does not have yet is the leader's; a
// replica that fails otherwise is asked no more, and its failure is told.
func TestChunkReaderTakesWhatTheReplicaLacksFromTheLeader(t *testing.T) {
	leader := chunkStream{1: {data: []byte("abc"), seq: 1}, 2: {data: []byte("def"), seq: 2}, 3: {data: []byte("g"), seq: 3}}
	behind := chunkStream{1: leader[1]} // has applied the first chunk only
	r := &chunkReader{ctx: context.Background(), replica: behind, callTimeout: time.Second, leader: leader, left: 7}
	if got, err := io.ReadAll(r); err != nil || string(got) != "abcdefg" {
		t.Errorf("a replica behind: %q, %v; want the leader's chunks", got, err)
	}
	if r.noReplica.Load() {
		t.Error("a replica that only lacked chunks is asked no more")
	}

	var asked atomic.Int32
	var told []error
	r = &chunkReader{ctx: context.Background(), replica: failingGets{&asked}, callTimeout: time.Second, leader: leader, left: 7,
		replicaFailed: func(err error, _ time.Time) { told = append(told, err) }}
	if got, err := io.ReadAll(r); err != nil || string(got) != "abcdefg" {
		t.Errorf("a failing replica: %q, %v; want the leader's chunks", got, err)
	}
	if n := asked.Load(); n != 1 || len(told) != 1 {
		t.Errorf("a failing replica was asked %d times and its failure told %d times, want once each", n, len(told))
	}
}
