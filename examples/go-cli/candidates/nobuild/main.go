// Command calc is a candidate that does not build: every check fails.
package main

func main() {
	this is not Go
}
