package supervisor

import (
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
)

// ParseJUnitXML parses a JUnit XML report in the dialects of pytest
// --junitxml (xunit1 and xunit2), go-junit-report, Maven Surefire and
// jest-junit: a <testsuites> or <testsuite> root, suites nested to any depth
// within the limits, <testcase> elements with <failure>, <error> and
// <skipped> children; <properties>, <system-out> and <system-err> are
// skipped unread.
//
// The XML is read as a stream of tokens with encoding/xml: any directive
// (<!DOCTYPE …>, <!ENTITY …>) is refused before it could declare an entity,
// unknown entities are errors (strict mode), and depth, element count and
// bytes are bounded, so a billion-laughs document, a gigabyte of test cases
// and a deeply nested document all end in an error in bounded memory.
//
// A case with an <error> is an error check; with a <failure> (or Surefire's
// <rerunFailure>/<rerunError> beside a final failure) failed; with
// <skipped> (pytest also writes xfail so) skipped; Surefire's flaky
// variants (<flakyFailure>, <flakyError>: failed, then passed on a rerun)
// make the check an error, because a rerun is not a pass of the same run.
// A <testsuite> whose tests="N" disagrees with the cases it holds is refused
// as inconsistent (a sign of a cut or spliced report).
func ParseJUnitXML(r io.Reader, lim ParseLimits) (Report, error) {
	lim = lim.withDefaults()
	cr := newCappedReader(r, lim.MaxBytes)
	dec := xml.NewDecoder(cr)
	dec.Strict = true
	// No entity map: only the five predefined entities and character
	// references are known; anything else is a syntax error.
	dec.Entity = nil
	dec.CharsetReader = func(label string, in io.Reader) (io.Reader, error) {
		switch strings.ToLower(label) {
		case "utf-8", "utf8", "us-ascii", "ascii":
			return in, nil
		}
		return nil, unparseable("charset %q is not UTF-8", label)
	}

	col := &collector{max: lim.MaxChecks}
	type suite struct {
		name      string
		claimed   int // tests="N", or -1
		cases     int
		isSuite   bool // <testsuite>, not <testsuites>
		caseStart int
	}
	var (
		suites   []suite
		depth    int
		elements int
		rootSeen bool
		inCase   bool
		caseElem Check
		caseDep  int
		skipDep  int // >0 while inside an element whose content is not read
	)
	fail := func(err error) (Report, error) {
		var se *xml.SyntaxError
		switch {
		case cr.exceeded():
			return Report{}, cr.overOr(err)
		case errors.Is(err, ErrTooLarge), errors.Is(err, ErrUnparseable):
			return Report{}, err
		case errors.As(err, &se):
			return Report{}, unparseable("xml line %d: %s", se.Line, se.Msg)
		}
		return Report{}, unparseable("xml: %v", err)
	}

	for {
		tok, err := dec.Token() // Token, not RawToken: it checks that tags match
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(err)
		}
		switch t := tok.(type) {
		case xml.Directive:
			return Report{}, unparseable("xml directive <!%s…> refused (no DTDs or entities)", firstWord(t))
		case xml.ProcInst:
			if t.Target != "xml" || rootSeen {
				continue
			}
		case xml.StartElement:
			elements++
			depth++
			if elements > lim.MaxElements {
				return Report{}, tooLarge("more than %d xml elements", lim.MaxElements)
			}
			if depth > lim.MaxDepth {
				return Report{}, tooLarge("xml nested deeper than %d", lim.MaxDepth)
			}
			if skipDep > 0 {
				skipDep++
				continue
			}
			name := t.Name.Local
			if depth == 1 && rootSeen {
				return Report{}, unparseable("a second root element <%s>", name)
			}
			if !rootSeen {
				rootSeen = true
				if name != "testsuites" && name != "testsuite" {
					return Report{}, unparseable("root element <%s> is not <testsuites> or <testsuite>", name)
				}
			}
			switch {
			case inCase:
				switch name {
				case "failure", "rerunFailure", "rerunError":
					raise(&caseElem, CheckFailed, attr(t, "message"))
				case "error", "flakyFailure", "flakyError":
					msg := attr(t, "message")
					if name != "error" {
						msg = name + ": " + msg
					}
					raise(&caseElem, CheckError, msg)
				case "skipped":
					raise(&caseElem, CheckSkipped, attr(t, "message"))
				}
				// Contents of a case's children (stack traces, captured
				// output) are not read.
				skipDep = 1
			case name == "testsuites" || name == "testsuite":
				s := suite{name: attr(t, "name"), claimed: -1, isSuite: name == "testsuite", caseStart: len(col.checks)}
				if v, ok := attrOK(t, "tests"); ok && s.isSuite {
					n, err := strconv.Atoi(strings.TrimSpace(v))
					if err != nil || n < 0 {
						return Report{}, unparseable("testsuite tests=%q is not a count", v)
					}
					s.claimed = n
				}
				suites = append(suites, s)
			case name == "testcase":
				if len(suites) == 0 {
					return Report{}, unparseable("<testcase> outside a test suite")
				}
				suiteName := attr(t, "classname")
				if _, ok := attrOK(t, "classname"); !ok {
					suiteName = suites[len(suites)-1].name
				}
				caseElem = Check{Name: joinName(suiteName, attr(t, "name")), Status: CheckPassed}
				if v, ok := attrOK(t, "time"); ok && strings.TrimSpace(v) != "" {
					f, err := strconv.ParseFloat(strings.TrimSpace(strings.ReplaceAll(v, ",", "")), 64)
					if err != nil {
						return Report{}, unparseable("testcase time=%q is not a number", v)
					}
					d, err := seconds(f)
					if err != nil {
						return Report{}, unparseable("testcase time: %v", err)
					}
					caseElem.Duration = d
				}
				if attr(t, "name") == "" {
					return Report{}, unparseable("<testcase> without a name")
				}
				inCase = true
				caseDep = depth
			default:
				// <properties>, <system-out>, <system-err> and anything else
				// outside a case: skipped unread.
				skipDep = 1
			}
		case xml.EndElement:
			depth--
			if depth < 0 {
				return Report{}, unparseable("unbalanced </%s>", t.Name.Local)
			}
			if skipDep > 0 {
				skipDep--
				continue
			}
			switch {
			case inCase && depth+1 == caseDep:
				inCase = false
				if err := col.add(caseElem); err != nil {
					return Report{}, err
				}
				for i := range suites {
					suites[i].cases++
				}
			case t.Name.Local == "testsuite" || t.Name.Local == "testsuites":
				s := suites[len(suites)-1]
				suites = suites[:len(suites)-1]
				if s.isSuite && s.claimed >= 0 && s.claimed != s.cases {
					return Report{}, unparseable("testsuite %q claims %d tests but holds %d", s.name, s.claimed, s.cases)
				}
			}
		case xml.CharData:
			if depth == 0 && len(strings.TrimSpace(string(t))) > 0 {
				return Report{}, unparseable("text outside the root element")
			}
		}
	}
	if !rootSeen {
		return Report{}, unparseable("no root element")
	}
	if depth != 0 {
		return Report{}, unparseable("document ends inside an element (truncated report?)")
	}
	return Report{Format: FormatJUnitXML, Checks: nonNil(col.checks)}, nil
}

// raise moves a case to a worse status: error > failed > skipped > passed.
func raise(c *Check, s CheckStatus, msg string) {
	rank := map[CheckStatus]int{CheckPassed: 0, CheckSkipped: 1, CheckFailed: 2, CheckError: 3}
	if rank[s] >= rank[c.Status] {
		if rank[s] > rank[c.Status] || c.Message == "" {
			c.Message = msg
		}
		c.Status = s
	}
}

func attrOK(t xml.StartElement, name string) (string, bool) {
	for _, a := range t.Attr {
		if a.Name.Local == name && a.Name.Space == "" {
			return a.Value, true
		}
	}
	return "", false
}

func attr(t xml.StartElement, name string) string {
	v, _ := attrOK(t, name)
	return v
}

func firstWord(d xml.Directive) string {
	s := strings.TrimSpace(string(d))
	if i := strings.IndexAny(s, " \t\r\n["); i >= 0 {
		s = s[:i]
	}
	if len(s) > 16 {
		s = s[:16]
	}
	return s
}
