module sandboxd-examples-cli

go 1.22
