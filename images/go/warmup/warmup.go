// Package warmup imports what Go graders and candidates commonly use, so
// that the image's build cache holds those standard packages compiled.
package warmup

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

var _ = []any{bufio.NewReader, bytes.NewReader, json.Marshal, errors.New, fmt.Sprint, io.Copy, math.Abs,
	net.Dial, http.Get, os.Open, exec.Command, sort.Ints, strconv.Itoa, strings.Cut, sync.NewCond, time.Now, unicode.IsLetter}

// Add adds.
func Add(a, b int) int { return a + b }
