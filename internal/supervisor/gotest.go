package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// testEvent is one test2json event (cmd/test2json, go doc test2json). Only
// the Action of an event decides anything; Output text is never read, so a
// test that prints "--- PASS" or "ok" changes nothing.
type testEvent struct {
	Action      string   `json:"Action"`
	Package     string   `json:"Package"`
	Test        string   `json:"Test"`
	Elapsed     *float64 `json:"Elapsed"`
	FailedBuild string   `json:"FailedBuild"`
	ImportPath  string   `json:"ImportPath"`
}

// ParseGoTestJSON parses the output of go test -json.
//
// Every line must be a JSON event. A test's pass, fail or skip event is its
// result; a test that started but never ended (a timeout, a crash of the
// test binary) is an error; a package that failed without a failing test of
// its own (a build failure, a panic outside a test, TestMain) is an error
// check named after the package. Unknown actions are refused.
func ParseGoTestJSON(r io.Reader, lim ParseLimits) (Report, error) {
	lim = lim.withDefaults()
	cr := newCappedReader(r, lim.MaxBytes)
	sc := bufio.NewScanner(cr)
	sc.Buffer(make([]byte, 0, 64<<10), lim.MaxLine)

	col := &collector{max: lim.MaxChecks}
	type pkgState struct {
		running     map[string]int // test name → runs not yet ended
		order       []string       // tests started, in order
		failedTests bool           // a test in it failed or errored
		result      string         // the package's own terminal action
		failedBuild bool
		elapsed     time.Duration
	}
	pkgs := map[string]*pkgState{}
	var pkgOrder []string
	pkg := func(name string) *pkgState {
		p, ok := pkgs[name]
		if !ok {
			p = &pkgState{running: map[string]int{}}
			pkgs[name] = p
			pkgOrder = append(pkgOrder, name)
		}
		return p
	}

	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		if raw[0] != '{' {
			return Report{}, cr.overOr(unparseable("line %d is not a test2json event", line))
		}
		var ev testEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			return Report{}, cr.overOr(unparseable("line %d: %v", line, err))
		}
		switch ev.Action {
		case "start", "output", "pause", "cont", "bench", "attr", "artifacts", "build-output", "build-fail":
			// No result: output is never read, build events are followed by
			// the package's own fail event naming FailedBuild.
			continue
		case "run":
			if ev.Test == "" {
				return Report{}, cr.overOr(unparseable("line %d: run event without a test", line))
			}
			p := pkg(ev.Package)
			if _, ok := p.running[ev.Test]; !ok {
				p.order = append(p.order, ev.Test)
			}
			p.running[ev.Test]++
		case "pass", "fail", "skip":
			p := pkg(ev.Package)
			d, err := elapsed(ev.Elapsed)
			if err != nil {
				return Report{}, cr.overOr(unparseable("line %d: %v", line, err))
			}
			if ev.Test == "" {
				if p.result != "" {
					return Report{}, cr.overOr(unparseable("line %d: package %s ended twice", line, ev.Package))
				}
				p.result = ev.Action
				p.failedBuild = ev.FailedBuild != ""
				p.elapsed = d
				continue
			}
			if p.running[ev.Test] > 0 {
				p.running[ev.Test]--
			}
			status := map[string]CheckStatus{"pass": CheckPassed, "fail": CheckFailed, "skip": CheckSkipped}[ev.Action]
			if status == CheckFailed {
				p.failedTests = true
			}
			if err := col.add(Check{Name: joinName(ev.Package, ev.Test), Status: status, Duration: d}); err != nil {
				return Report{}, cr.overOr(err)
			}
		default:
			return Report{}, cr.overOr(unparseable("line %d: unknown action %q", line, ev.Action))
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, ErrTooLarge) {
			return Report{}, cr.overOr(err)
		}
		if errors.Is(err, bufio.ErrTooLong) {
			return Report{}, tooLarge("a line longer than %d bytes", lim.MaxLine)
		}
		return Report{}, cr.overOr(unparseable("reading: %v", err))
	}

	for _, name := range pkgOrder {
		p := pkgs[name]
		for _, t := range p.order {
			if p.running[t] > 0 {
				p.failedTests = true
				msg := "started but never ended"
				if p.result == "fail" {
					msg += " (the package failed: a timeout or a crash)"
				}
				if err := col.add(Check{Name: joinName(name, t), Status: CheckError, Message: msg}); err != nil {
					return Report{}, cr.overOr(err)
				}
			}
		}
		switch {
		case p.result == "" && len(p.order) > 0:
			// The stream ended before the package did: the report is cut.
			return Report{}, cr.overOr(unparseable("package %s has no final result (truncated report?)", name))
		case p.result == "fail" && !p.failedTests:
			msg := "package failed without a failing test"
			if p.failedBuild {
				msg = "build failed"
			}
			if err := col.add(Check{Name: name, Status: CheckError, Duration: p.elapsed, Message: msg}); err != nil {
				return Report{}, cr.overOr(err)
			}
		}
	}
	return Report{Format: FormatGoTestJSON, Checks: nonNil(col.checks)}, nil
}

func elapsed(s *float64) (time.Duration, error) {
	if s == nil {
		return 0, nil
	}
	return seconds(*s)
}

// seconds converts a report's seconds to a duration, refusing nonsense.
func seconds(s float64) (time.Duration, error) {
	if math.IsNaN(s) || s < 0 || s > 1e6 {
		return 0, fmt.Errorf("%v seconds is out of range", s)
	}
	return time.Duration(math.Round(s*1e3)) * time.Millisecond, nil
}

func nonNil(c []Check) []Check {
	if c == nil {
		return []Check{}
	}
	return c
}
