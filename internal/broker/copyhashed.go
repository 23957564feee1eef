package broker

import "io"

// copyChunk is the size of copyHashed's two buffers.
const copyChunk = 1 << 20

// copyHashed copies r to w as io.Copy does, and writes what it copies to
// h (a hash) on a goroutine of its own: the hash of one chunk runs while
// the chunk is written and the next one read. When it returns without an
// error, h was given exactly what w was, in order; h is never touched
// after it returns.
func copyHashed(w io.Writer, r io.Reader, h io.Writer) (int64, error) {
	todo := make(chan []byte, 2)
	hashed := make(chan struct{}, 2)
	go func() {
		for p := range todo {
			h.Write(p)
			hashed <- struct{}{}
		}
		close(hashed)
	}()
	bufs := [2][]byte{make([]byte, copyChunk), make([]byte, copyChunk)}
	var (
		total    int64
		inFlight int
		err      error
	)
	for i := 0; ; i ^= 1 {
		if inFlight == 2 {
			// bufs[i] went to the hash before the other one: done first.
			<-hashed
			inFlight--
		}
		n, rerr := r.Read(bufs[i])
		if n > 0 {
			todo <- bufs[i][:n]
			inFlight++
			m, werr := w.Write(bufs[i][:n])
			total += int64(m)
			if werr == nil && m != n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				err = werr
				break
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err = rerr
			break
		}
	}
	close(todo)
	for range hashed {
	}
	return total, err
}
