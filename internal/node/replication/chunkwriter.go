package replication

import (
	"io"
	"sync/atomic"
)

// chunkWriter cuts the zfs send stream into messages of chunkSize.
type chunkWriter struct {
	send func([]byte) error
	buf  []byte
	sent *atomic.Int64
}

func (w *chunkWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		room := chunkSize - len(w.buf)
		take := min(room, len(b))
		w.buf = append(w.buf, b[:take]...)
		b = b[take:]
		if len(w.buf) == chunkSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// ReadFrom fills chunks straight from the zfs send pipe, saving io.Copy's
// intermediate buffer and a copy per byte.
func (w *chunkWriter) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		if cap(w.buf) < chunkSize {
			w.buf = make([]byte, 0, chunkSize)
		}
		m, err := io.ReadFull(r, w.buf[len(w.buf):chunkSize])
		w.buf = w.buf[:len(w.buf)+m]
		n += int64(m)
		if len(w.buf) == chunkSize {
			if ferr := w.flush(); ferr != nil {
				return n, ferr
			}
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return n, nil
		case err != nil:
			return n, err
		}
	}
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if err := w.send(w.buf); err != nil {
		return err
	}
	w.sent.Add(int64(len(w.buf)))
	w.buf = make([]byte, 0, chunkSize) // the transport may still hold the sent slice
	return nil
}
