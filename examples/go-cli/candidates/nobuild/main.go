// Command calc is a candidate that does not build (a type error): every
// check fails.
package main

func main() {
	var n int = "not a number"
	_ = n
}
