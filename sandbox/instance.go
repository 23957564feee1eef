package sandbox

import "regexp"

// MaxInstanceBytes bounds an instance id.
const MaxInstanceBytes = 128

// AnnotationInstance is the annotation of a test-result statement's
// "bundle" configuration entry that names the bundle's instance.
const AnnotationInstance = "instance"

// instanceRE is the grammar of an instance id: that of a job id. It admits
// SWE-bench's ids (astropy__astropy-12907, which write a repository's
// owner/name as owner__name for this very reason) and keeps every id safe
// as a file name, a URL path segment, a shell word and a log value
// without quoting: no '/', '#', space or anything outside ASCII.
var instanceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`) // and at most MaxInstanceBytes (see jobIDRE)

// ValidInstance reports whether s can name an instance: 1 to
// MaxInstanceBytes ASCII letters, digits, '.', '_' and '-', starting with
// a letter or digit.
func ValidInstance(s string) bool { return len(s) <= MaxInstanceBytes && instanceRE.MatchString(s) }
