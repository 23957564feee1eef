package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

var (
	tapVersionRE = regexp.MustCompile(`^TAP version (\d+)$`)
	tapPlanRE    = regexp.MustCompile(`^1\.\.(\d+)(?:\s*#\s*(.*))?$`)
	tapPointRE   = regexp.MustCompile(`^(not ok|ok)\b(?:\s+(\d+))?(.*)$`)
	tapSubtestRE = regexp.MustCompile(`^#\s*Subtest(?::\s*(.*))?$`)
)

// tapPlanCheck names the error check of a missing or broken plan; the
// parentheses keep it apart from any test's own description.
const tapPlanCheck = "(plan)"

// tapFrame is one level of (sub)test nesting.
type tapFrame struct {
	header   string // from "# Subtest: name", if any
	planned  int    // -1 until a plan is read
	skipAll  bool   // 1..0 # SKIP
	count    int
	checks   []Check // the frame's own checks, names not yet prefixed
	children []Check // a closed subtest waiting for its test point
	childHdr string
}

// ParseTAP parses a TAP 13 or TAP 14 stream (a .t script's raw output, or
// one file of a prove --archive). A "not ok" is failed, "ok" passed, any
// "# SKIP" skipped, and a "# TODO" point skipped too (an expected failure is
// not a pass). Subtests (lines indented by four spaces, optionally headed by
// "# Subtest: name") become "parent/child" checks. "Bail out!" ends the
// stream with an error check named "Bail out!". A missing plan, or a plan
// that disagrees with the points read, is an error check named "(plan)".
// Either marks the report Incomplete: the tests it did not run may be the
// ones a policy requires, so it is inconclusive (RuleReportIncomplete).
// YAML diagnostics, comments and unknown lines are skipped unread.
func ParseTAP(r io.Reader, lim ParseLimits) (Report, error) {
	lim = lim.withDefaults()
	cr := newCappedReader(r, lim.MaxBytes)
	sc := bufio.NewScanner(cr)
	sc.Buffer(make([]byte, 0, 64<<10), lim.MaxLine)
	col := &collector{max: lim.MaxChecks}

	stack := []*tapFrame{{planned: -1}}
	var (
		pendingHdr string // "# Subtest:" read at the current level
		yamlIndent = -1   // indentation of an open YAML block's "---"
		lineNo     int
		seenLine   bool
		bailed     bool
		incomplete []string // why the stream shows it was cut short
	)
	held := 0 // checks held in frames, counted against MaxChecks
	hold := func(f *tapFrame, c Check) error {
		held++
		if held > lim.MaxChecks {
			return tooLarge("more than %d checks", lim.MaxChecks)
		}
		f.checks = append(f.checks, c)
		return nil
	}
	// closeFrame pops the innermost frame and leaves its checks with the
	// parent, to be named by the parent's next test point.
	closeFrame := func() {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		parent := stack[len(stack)-1]
		all := frameChecks(f, &incomplete)
		parent.children = append(parent.children, all...)
		parent.childHdr = f.header
	}

	for sc.Scan() {
		lineNo++
		line := strings.TrimRight(sc.Text(), "\r")
		trimmed := strings.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		if strings.TrimSpace(trimmed) == "" {
			continue
		}
		if yamlIndent >= 0 {
			if indent == yamlIndent && strings.TrimSpace(trimmed) == "..." {
				yamlIndent = -1
			} else if indent < yamlIndent {
				return Report{}, cr.overOr(unparseable("line %d: YAML block not closed", lineNo))
			}
			continue
		}
		if indent%4 == 2 && strings.TrimSpace(trimmed) == "---" {
			yamlIndent = indent
			continue
		}
		if indent%4 != 0 {
			continue // not TAP at any level: ignored, never read as a result
		}
		level := indent / 4
		if level+1 > lim.MaxDepth {
			return Report{}, tooLarge("subtests nested deeper than %d", lim.MaxDepth)
		}
		if strings.HasPrefix(trimmed, "Bail out!") {
			reason := strings.TrimSpace(strings.TrimPrefix(trimmed, "Bail out!"))
			if err := col.add(Check{Name: "Bail out!", Status: CheckError, Message: reason}); err != nil {
				return Report{}, cr.overOr(err)
			}
			incomplete = append(incomplete, strings.TrimSpace("Bail out! "+reason))
			bailed = true
			break
		}
		// Deeper lines open subtests; shallower ones close them.
		for level > len(stack)-1 {
			stack = append(stack, &tapFrame{planned: -1, header: pendingHdr})
			pendingHdr = ""
		}
		for level < len(stack)-1 {
			closeFrame()
		}
		f := stack[len(stack)-1]

		switch {
		case tapVersionRE.MatchString(trimmed):
			v, _ := strconv.Atoi(tapVersionRE.FindStringSubmatch(trimmed)[1])
			if v != 13 && v != 14 {
				return Report{}, cr.overOr(unparseable("line %d: TAP version %d is not 13 or 14", lineNo, v))
			}
			if level == 0 && seenLine {
				return Report{}, cr.overOr(unparseable("line %d: TAP version line after the start", lineNo))
			}
		case tapPlanRE.MatchString(trimmed):
			m := tapPlanRE.FindStringSubmatch(trimmed)
			if f.planned >= 0 {
				return Report{}, cr.overOr(unparseable("line %d: a second plan", lineNo))
			}
			n, err := strconv.Atoi(m[1])
			if err != nil || n > lim.MaxChecks {
				return Report{}, cr.overOr(unparseable("line %d: plan %q out of range", lineNo, m[1]))
			}
			f.planned = n
			f.skipAll = n == 0
		case tapPointRE.MatchString(trimmed):
			m := tapPointRE.FindStringSubmatch(trimmed)
			rest := m[3]
			if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
				continue // "okay", "oktober": not a test point
			}
			f.count++
			if m[2] != "" {
				n, err := strconv.Atoi(m[2])
				if err != nil || n != f.count {
					return Report{}, cr.overOr(unparseable("line %d: test %s out of sequence (expected %d)", lineNo, m[2], f.count))
				}
			}
			desc, directive, reason := splitTAPDirective(rest)
			c := Check{Name: desc, Status: CheckPassed}
			if c.Name == "" {
				c.Name = fmt.Sprintf("test %d", f.count)
			}
			if m[1] == "not ok" {
				c.Status = CheckFailed
			}
			switch directive {
			case "skip":
				c.Status, c.Message = CheckSkipped, "SKIP "+reason
			case "todo":
				c.Status, c.Message = CheckSkipped, "TODO "+reason
			}
			if err := hold(f, c); err != nil {
				return Report{}, cr.overOr(err)
			}
			if len(f.children) > 0 {
				prefix := c.Name
				if desc == "" && f.childHdr != "" {
					prefix = f.childHdr
				}
				for _, ch := range f.children {
					ch.Name = prefix + "/" + ch.Name
					if err := hold(f, ch); err != nil {
						return Report{}, cr.overOr(err)
					}
					held-- // already counted once
				}
				f.children, f.childHdr = nil, ""
			}
		case tapSubtestRE.MatchString(trimmed):
			pendingHdr = strings.TrimSpace(tapSubtestRE.FindStringSubmatch(trimmed)[1])
		default:
			// Comments, "pragma" lines and unknown lines: never results.
		}
		seenLine = true
	}
	if cr.exceeded() {
		return Report{}, cr.overOr(nil)
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
	if yamlIndent >= 0 && !bailed {
		return Report{}, cr.overOr(unparseable("the stream ends inside a YAML block (truncated report?)"))
	}
	if !bailed && len(stack) > 1 {
		return Report{}, cr.overOr(unparseable("the stream ends inside a subtest (truncated report?)"))
	}
	for len(stack) > 1 {
		closeFrame()
	}
	top := stack[0]
	// A subtest closed without a test point of its own still counts.
	for _, ch := range top.children {
		name := ch.Name
		if top.childHdr != "" {
			name = top.childHdr + "/" + name
		}
		ch.Name = name
		top.checks = append(top.checks, ch)
	}
	top.children = nil
	for _, c := range frameChecks(top, &incomplete) {
		if err := col.add(c); err != nil {
			return Report{}, cr.overOr(err)
		}
	}
	return Report{Format: FormatTAP, Checks: nonNil(col.checks), Incomplete: strings.Join(incomplete, "; ")}, nil
}

// frameChecks returns a frame's checks plus an error check for a missing or
// broken plan, prefixing nothing; the plan's problem is added to incomplete.
func frameChecks(f *tapFrame, incomplete *[]string) []Check {
	out := f.checks
	for _, ch := range f.children {
		name := ch.Name
		if f.childHdr != "" {
			name = f.childHdr + "/" + name
		}
		ch.Name = name
		out = append(out, ch)
	}
	var problem string
	switch {
	case f.planned < 0:
		problem = fmt.Sprintf("no plan; %d tests ran (truncated report?)", f.count)
	case f.planned != f.count:
		problem = fmt.Sprintf("planned %d tests, %d ran", f.planned, f.count)
	default:
		return out
	}
	out = append(out, Check{Name: tapPlanCheck, Status: CheckError, Message: problem})
	if f.header != "" {
		problem = fmt.Sprintf("subtest %q: %s", f.header, problem)
	}
	*incomplete = append(*incomplete, problem)
	return out
}

// splitTAPDirective splits what follows "ok N" into the description (with
// a leading "-" dropped and "\#" unescaped), the directive ("skip", "todo"
// or "") and the directive's reason.
func splitTAPDirective(rest string) (desc, directive, reason string) {
	var b strings.Builder
	tail := ""
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c == '\\' && i+1 < len(rest) && (rest[i+1] == '#' || rest[i+1] == '\\') {
			b.WriteByte(rest[i+1])
			i++
			continue
		}
		if c == '#' {
			tail = rest[i+1:]
			break
		}
		b.WriteByte(c)
	}
	desc = strings.TrimSpace(b.String())
	desc = strings.TrimSpace(strings.TrimPrefix(desc, "-"))
	tail = strings.TrimSpace(tail)
	word, after, _ := strings.Cut(tail, " ")
	lw := strings.ToLower(word)
	switch {
	case strings.HasPrefix(lw, "skip"):
		return desc, "skip", strings.TrimSpace(after)
	case strings.HasPrefix(lw, "todo"):
		return desc, "todo", strings.TrimSpace(after)
	}
	return desc, "", ""
}
