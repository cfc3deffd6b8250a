package replication

import (
	"errors"
	"io"
	"sync/atomic"
)

// A chunkWriter cuts the zfs send stream into messages and sends them
// from a goroutine of its own, so that zfs send keeps writing while a
// message is on its way. Sent from the goroutine that reads zfs send, a
// chunk would wait for the one before it to reach the receiver while zfs
// send waited on its full pipe: a stream would take the time to produce
// it plus the time to carry it, not the longer of the two. The first
// chunk is small (firstChunkSize): the receiver starts its zfs receive
// on the stream's first record, which then waits for 64 KiB of zfs send,
// not a whole chunk.
//
// At most chunksAhead chunks wait beside the one being sent and the one
// being filled: a push holds 3 MiB of them at most.
type chunkWriter struct {
	send  func([]byte) error
	sent  *atomic.Int64 // bytes the receiver was sent
	size  int           // of the chunk being filled
	buf   []byte
	queue chan []byte
	done  chan struct{} // closed when the sending goroutine has ended
	err   error         // the send that ended it early; read after done
	ended bool          // queue is closed
}

const (
	firstChunkSize = 64 << 10
	chunksAhead    = 1
)

// errWriterEnded is what a write after the end gets.
var errWriterEnded = errors.New("the stream's sender has ended")

// newChunkWriter starts a chunkWriter that sends each chunk with send and
// counts what was sent into sent. Its user ends it with flush, or with
// stop when the stream failed.
func newChunkWriter(send func([]byte) error, sent *atomic.Int64) *chunkWriter {
	w := &chunkWriter{send: send, sent: sent, size: firstChunkSize, queue: make(chan []byte, chunksAhead), done: make(chan struct{})}
	go w.run()
	return w
}

// run sends the chunks in order until the queue closes or a send fails.
func (w *chunkWriter) run() {
	defer close(w.done)
	for chunk := range w.queue {
		if err := w.send(chunk); err != nil {
			w.err = err
			return
		}
		w.sent.Add(int64(len(chunk)))
	}
}

func (w *chunkWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		w.grow()
		take := min(w.size-len(w.buf), len(b))
		w.buf = append(w.buf, b[:take]...)
		b = b[take:]
		if len(w.buf) == w.size {
			if err := w.pass(); err != nil {
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
		w.grow()
		m, err := io.ReadFull(r, w.buf[len(w.buf):w.size])
		w.buf = w.buf[:len(w.buf)+m]
		n += int64(m)
		if len(w.buf) == w.size {
			if perr := w.pass(); perr != nil {
				return n, perr
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

// grow gives the chunk being filled a buffer of its own, of the chunk's
// size: the transport may still hold a chunk passed on.
func (w *chunkWriter) grow() {
	if w.buf == nil {
		w.buf = make([]byte, 0, w.size)
	}
}

// pass hands the filled chunk to the sending goroutine, waiting while
// chunksAhead wait already; it returns the error of a send that failed.
func (w *chunkWriter) pass() error {
	chunk := w.buf
	w.buf, w.size = nil, chunkSize
	if w.ended {
		return errWriterEnded
	}
	select {
	case w.queue <- chunk:
		return nil
	case <-w.done:
		if w.err != nil {
			return w.err
		}
		return errWriterEnded
	}
}

// flush sends what is left of the stream, waits until every chunk is
// sent, and returns the first send's error.
func (w *chunkWriter) flush() error {
	if len(w.buf) > 0 {
		if err := w.pass(); err != nil {
			w.stop()
			return err
		}
	}
	w.stop()
	return w.err
}

// stop waits for the chunks passed on to be sent (or their first send to
// fail) and drops the one being filled; a stream that failed ends with
// it. It is safe to call more than once.
func (w *chunkWriter) stop() {
	if !w.ended {
		w.ended = true
		close(w.queue)
	}
	<-w.done
}
