package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// Only the modes that are harmless on a host run here; the report mode
// runs in sandboxes (integration/hostile).
func TestModes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want result
	}{
		{"files", []string{"files", "3", dir}, 0, result{Count: 3}},
		{"files into a missing dir", []string{"files", "2", dir + "/missing"}, 0, result{Count: 0, Errno: "ENOENT"}},
		{"unknown mode", []string{"escape"}, 2, result{}},
		{"files without a dir", []string{"files", "3"}, 2, result{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, nil, &out, &errb); code != tc.code {
				t.Fatalf("got exit %d (%s), want %d", code, errb.String(), tc.code)
			}
			if tc.code != 0 {
				return
			}
			var got result
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("got %d files, want 3", len(ents))
	}
}
