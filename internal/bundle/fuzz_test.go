package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
)

// fuzzLimits keep each input cheap.
var fuzzLimits = TreeLimits{MaxBytes: 1 << 20, MaxFiles: 256, MaxPathBytes: 256, MaxDepth: 16}

// FuzzWriteTar: whatever tar WriteTar accepts, its output passes CheckTar
// with the same digest and ingests again to the very same bytes.
func FuzzWriteTar(f *testing.F) {
	f.Add(makeTar(f, reg("a", "x"), dirEnt("d/"), reg("d/b", "y")))
	f.Add(makeTar(f, reg("../x", "x")))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		sum, err := WriteTar(ctx, bytes.NewReader(data), &out, fuzzLimits)
		if err != nil {
			if out.Len() != 0 {
				t.Fatalf("refused (%v) after writing %d bytes", err, out.Len())
			}
			return
		}
		got, err := CheckTar(ctx, bytes.NewReader(out.Bytes()), fuzzLimits, sum.Digest)
		if err != nil {
			t.Fatalf("CheckTar refused WriteTar's output: %v", err)
		}
		if got != sum {
			t.Fatalf("CheckTar: got %+v, want %+v", got, sum)
		}
		var again bytes.Buffer
		if _, err := WriteTar(ctx, bytes.NewReader(out.Bytes()), &again, fuzzLimits); err != nil {
			t.Fatalf("WriteTar refused its own output: %v", err)
		}
		if !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatal("WriteTar is not idempotent")
		}
	})
}

// FuzzCheckTar: whatever CheckTar accepts, WriteTar reproduces byte for byte.
func FuzzCheckTar(f *testing.F) {
	f.Add(makeTar(f, canonReg("a")))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		sum, err := CheckTar(ctx, bytes.NewReader(data), fuzzLimits, "")
		if err != nil {
			return
		}
		var out bytes.Buffer
		again, err := WriteTar(ctx, bytes.NewReader(data), &out, fuzzLimits)
		if err != nil {
			t.Fatalf("WriteTar refused a canonical tar: %v", err)
		}
		if again != sum || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("a canonical tar did not reproduce itself: %+v vs %+v", again, sum)
		}
	})
}

// FuzzDecodeManifest: whatever DecodeManifest accepts is valid and
// survives an encode/decode round trip unchanged.
func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte(`{"schema_version":"sandboxd.bundle/v1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded manifest does not validate: %v", err)
		}
		enc, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := DecodeManifest(enc)
		if err != nil {
			t.Fatalf("re-encoded manifest refused: %v\n%s", err, enc)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
		}
	})
}
