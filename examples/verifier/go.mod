module github.com/sandboxd/sandboxd/examples/verifier

go 1.26.8

require github.com/sandboxd/sandboxd v0.0.0

replace github.com/sandboxd/sandboxd => ../..
