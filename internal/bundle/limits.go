package bundle

import "fmt"

// maxComponentBytes is NAME_MAX on Linux: no path component may be longer.
const maxComponentBytes = 255

// TreeLimits are the ceilings enforced while a tree is read, before the bytes
// they guard are accepted. Every field must be positive.
type TreeLimits struct {
	// MaxBytes bounds the total content bytes of all regular files.
	MaxBytes int64
	// MaxFiles bounds the number of entries: regular files and directories.
	MaxFiles int64
	// MaxPathBytes bounds the length of a path relative to the tree's root.
	MaxPathBytes int
	// MaxDepth bounds the number of components of a path.
	MaxDepth int
}

// DefaultLimits are the ceilings for workspaces and bundles unless an
// operator tightens them.
func DefaultLimits() TreeLimits {
	return TreeLimits{
		MaxBytes:     1 << 30,
		MaxFiles:     100_000,
		MaxPathBytes: 1024,
		MaxDepth:     64,
	}
}

// Validate checks that every ceiling is set and sane.
func (l TreeLimits) Validate() error {
	switch {
	case l.MaxBytes <= 0:
		return fmt.Errorf("limits: max bytes %d must be positive", l.MaxBytes)
	case l.MaxFiles <= 0:
		return fmt.Errorf("limits: max files %d must be positive", l.MaxFiles)
	case l.MaxPathBytes <= 0 || l.MaxPathBytes > 4096:
		return fmt.Errorf("limits: max path bytes %d is not in [1, 4096]", l.MaxPathBytes)
	case l.MaxDepth <= 0 || l.MaxDepth > 1024:
		return fmt.Errorf("limits: max depth %d is not in [1, 1024]", l.MaxDepth)
	}
	return nil
}

// rawTarBudget is how many bytes of tar input a tree within l may take:
// its content plus, per entry, a header, an extended header of at most one
// path record and the padding of both.
func (l TreeLimits) rawTarBudget() int64 {
	return l.MaxBytes + (l.MaxFiles+1)*int64(4*512+l.MaxPathBytes) + 1<<16
}
