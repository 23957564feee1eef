module sandboxd-examples

go 1.22
