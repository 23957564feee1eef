// Package calc tries to fetch its answers over the network. Inside the
// sandbox there is only loopback and no resolver, so both attempts fail.
package calc

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Add returns a+b.
func Add(a, b int) int { return a + b }

// Fib asks an "oracle" on loopback and then by name; it returns -1 when
// neither answers.
func Fib(n int) int {
	c := http.Client{Timeout: 2 * time.Second}
	for _, u := range []string{"http://127.0.0.1:8080/fib/", "http://oracle.sandboxd.invalid/fib/"} {
		resp, err := c.Get(u + strconv.Itoa(n))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if v, err := strconv.Atoi(string(b)); err == nil {
			return v
		}
	}
	if _, err := net.LookupHost("oracle.sandboxd.invalid"); err == nil {
		fmt.Println("resolved a name: the sandbox has a resolver")
	}
	return -1
}
