package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// What go test prints is bounded where the grader keeps it: a flood of
// output from a check, of runs of tests it made up, of lines too long to
// be an event, keeps a few events, and the checks are judged as before.
func TestReadEventsKeepsWhatJudgeReads(t *testing.T) {
	var in bytes.Buffer
	ev := func(action, test, output string) {
		b, _ := json.Marshal(event{Action: action, Package: "example.com/calc", Test: test, Output: output})
		in.Write(append(b, '\n'))
	}
	ev("run", "TestAdd", "")
	for i := range 20000 {
		ev("output", "TestAdd", fmt.Sprintf("noise %d %s\n", i, strings.Repeat("x", 100)))
		ev("run", fmt.Sprintf("TestMadeUp%d", i), "") // "=== RUN   TestMadeUp…" printed by the code
	}
	in.WriteString(strings.Repeat("y", 200<<10) + "\n") // no event
	ev("fail", "TestAdd", "")
	ev("run", "TestFib", "")
	ev("run", "TestFib", "") // printed again by the code: ran twice
	ev("run", "TestFib", "")
	ev("pass", "TestFib", "")
	ev("run", "TestSub", "")
	ev("pass", "TestSub", "")

	checks := []string{"example.com/calc.TestAdd", "example.com/calc.TestFib", "example.com/calc.TestSub"}
	events := readEvents(&in, checks)
	if len(events) > 30 {
		t.Fatalf("%d events kept, want a few", len(events))
	}
	out := 0
	for _, e := range events {
		out += len(e.Output)
	}
	if out > maxTestOutput {
		t.Fatalf("%d bytes of output kept, want at most %d", out, maxTestOutput)
	}
	r := judge(checks, 1, events)
	if r[checks[0]].passed || !strings.Contains(r[checks[0]].why, "noise 0") {
		t.Errorf("TestAdd: %+v, want failed with its first output", r[checks[0]])
	}
	if r[checks[1]].passed || !strings.Contains(r[checks[1]].why, "ran it 2 times") {
		t.Errorf("TestFib: %+v, want failed (ran more than once)", r[checks[1]])
	}
	if !r[checks[2]].passed {
		t.Errorf("TestSub: %+v, want passed", r[checks[2]])
	}

	// A failure of a test that is no check still tells judge that go
	// test's events say fail.
	in.Reset()
	ev("run", "TestSub", "")
	ev("pass", "TestSub", "")
	ev("fail", "", "")
	events = readEvents(&in, checks[2:])
	if r := judge(checks[2:], 0, events); r[checks[2]].passed {
		t.Errorf("exit 0 with a failed package: %+v, want the disagreement", r)
	}
}
