package main

import (
	"bytes"
	"encoding/xml"
	"strings"
	"unicode/utf8"
)

// attr is s as a quoted XML attribute value; characters XML cannot hold
// become U+FFFD.
func attr(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' || (r >= 0x20 && r != 0xFFFE && r != 0xFFFF) {
			return r
		}
		return utf8.RuneError
	}, strings.ToValidUTF8(s, "\uFFFD"))
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return `"` + strings.ReplaceAll(b.String(), `"`, "&#34;") + `"`
}

func utf8Valid(b []byte) bool { return utf8.Valid(b) }
