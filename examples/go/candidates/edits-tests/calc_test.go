package calc

import "testing"

// The candidate "fixes" the tests in its copy: these names shadow the
// hidden ones and always pass.
func TestAdd(t *testing.T)      {}
func TestFib(t *testing.T)      {}
func TestFibLarge(t *testing.T) {}
