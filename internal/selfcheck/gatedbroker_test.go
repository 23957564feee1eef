package selfcheck

import "github.com/sandboxd/sandboxd/internal/server"

// The daemon checks a gated job before it journals it dispatched.
var _ server.Prechecker = GatedBroker{}
