package enginefake

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"strings"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// ShimBinary is the smallest static ELF executable header: broker.New
// accepts it as the helper binary, and no fake container ever runs it.
func ShimBinary() []byte {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1                // 64-bit, little-endian, version 1
	binary.LittleEndian.PutUint16(h[16:], 2)  // ET_EXEC
	binary.LittleEndian.PutUint16(h[18:], 62) // x86-64
	binary.LittleEndian.PutUint32(h[20:], 1)  // version
	binary.LittleEndian.PutUint16(h[52:], 64) // header size
	binary.LittleEndian.PutUint16(h[54:], 56) // program header size
	binary.LittleEndian.PutUint16(h[58:], 64) // section header size
	return h
}

// HelloFrame is the first frame of a helper's stream (stuffed), with which
// Stream begins.
func HelloFrame(nonce string) []byte {
	var b strings.Builder
	shim.WriteFrame(shim.NewStuffWriter(&b), shim.FrameHello, []byte(shim.Hello+nonce))
	return []byte(b.String())
}

// Stream is a whole helper stream: the hello with the container's nonce,
// the command's start, stdout, an empty collection and the status. Tests build recovered logs
// from it. It is stuffed, as the helper writes it.
func Stream(nonce string, stdout string, st shim.Status) []byte {
	var b strings.Builder
	b.Write(HelloFrame(nonce))
	w := shim.NewStuffWriter(&b)
	frame := func(typ byte, p []byte) { shim.WriteFrame(w, typ, p) }
	frame(shim.FrameStarting, nil)
	if stdout != "" {
		frame(shim.FrameStdout, []byte(stdout))
	}
	sum, _ := json.Marshal(shim.CollectSummary{LimitsHit: []string{}})
	frame(shim.FrameCollected, sum)
	if st.LimitsHit == nil {
		st.LimitsHit = []string{}
	}
	if st.ScratchUsed == nil {
		st.ScratchUsed = map[string]int64{}
	}
	stj, _ := json.Marshal(st)
	frame(shim.FrameStatus, stj)
	return []byte(b.String())
}

// Nonce returns the stream nonce the broker gave a container.
func Nonce(c *Container) string {
	for _, kv := range c.Config.Env {
		if v, ok := strings.CutPrefix(kv, shim.NonceEnv+"="); ok {
			return v
		}
	}
	return ""
}

// Helper is a Program that plays the in-container helper: it reads the
// config frame from stdin, then writes Stream with stdout and status
// and exits 0. If hold is not nil, it waits for hold to close (or the
// container to be killed) before it exits, as a helper that hangs after
// its last frame.
func Helper(stdout string, st shim.Status, hold <-chan struct{}) Program {
	return func(c *Container, stdin io.Reader, out, _ io.Writer) int {
		typ, _, err := shim.NewFrameReader(stdin).Next()
		if err != nil || typ != shim.FrameConfig {
			return 1
		}
		if _, err := out.Write(Stream(Nonce(c), stdout, st)); err != nil {
			return 1
		}
		if hold != nil {
			select {
			case <-hold:
			case <-c.Exited():
			}
		}
		return 0
	}
}
