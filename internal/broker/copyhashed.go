package broker

import "io"

// copyChunk is the size of copyHashed's two buffers.
const copyChunk = 1 << 20

// copyHashed copies r to w as io.Copy does, and writes what it copies to
// h (a hash, or a checker of the stream) on a goroutine of its own: h
// takes one chunk while the chunk is written to w and the next one read.
// When it returns without an error, h was given exactly what w was, in
// order. An error of h's stops the copy and is returned; h is never
// touched after copyHashed returns.
func copyHashed(w io.Writer, r io.Reader, h io.Writer) (int64, error) {
	todo := make(chan []byte, 2)
	hashed := make(chan struct{}, 2)
	failed := make(chan struct{})
	var herr error // set before failed is closed
	go func() {
		for p := range todo {
			if herr == nil {
				if _, err := h.Write(p); err != nil {
					herr = err
					close(failed)
				}
			}
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
	for i := 0; ; {
		if inFlight == 2 {
			// bufs[i] went to h before the other one: done first.
			<-hashed
			inFlight--
		}
		select {
		case <-failed:
			err = herr
		default:
		}
		if err != nil {
			break
		}
		n, rerr := r.Read(bufs[i])
		if n > 0 {
			todo <- bufs[i][:n]
			inFlight++
			m, werr := w.Write(bufs[i][:n])
			i ^= 1 // the other buffer next: this one is h's until hashed
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
	if err == nil && herr != nil {
		err = herr // h failed on the last chunk
	}
	return total, err
}
