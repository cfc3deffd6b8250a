// Package logqueue keeps a process's log from ever stopping its work.
//
// A plugin's stderr is a pipe its CO reads (Docker's daemon, Nomad's
// logmon). When the reader stops (a daemon restarted or hung), the pipe
// fills, and a write to it waits until someone reads; the logger holds
// its lock while it writes, so every goroutine that logs would wait too,
// the lease's beat and the self-fence among them. A node that lost its
// lease would then never make its volumes read-only (docs/safety.md,
// "The self-fence waits for nothing but the pool"). A Writer queues the
// lines instead and a goroutine of its own writes them out; when the
// queue is full it drops lines, counts them, and says so in the log once
// the reader is back.
package logqueue

import (
	"io"
	"sync/atomic"
	"time"
)

// DefaultLines is the queue a plugin's log gets: about a megabyte of
// lines, minutes of a busy node's debug log.
const DefaultLines = 4096

// Writer is an io.Writer that never blocks: each Write (one log line,
// as hclog writes them) is queued for out.
type Writer struct {
	out     io.Writer
	lines   chan []byte
	dropped atomic.Int64 // lines dropped since the last report
	pending atomic.Int64 // lines queued or being written
}

// New returns a Writer that queues at most capacity lines for out. It
// writes nothing until Start.
func New(out io.Writer, capacity int) *Writer {
	return &Writer{out: out, lines: make(chan []byte, capacity)}
}

// Start writes the queued lines out from now on. Before it writes a line
// after some were dropped, it calls report with how many: the logger
// writing through w reports them in its own format (a logger's line
// written here directly would break a JSON log). report may log through
// w: a line it logs is queued like any other.
func (w *Writer) Start(report func(dropped int64)) {
	go w.run(report)
}

// Write queues a copy of p, or drops it when the queue is full. It never
// fails: a log line is not worth an error to its caller.
func (w *Writer) Write(p []byte) (int, error) {
	line := append([]byte(nil), p...)
	w.pending.Add(1)
	select {
	case w.lines <- line:
	default:
		w.pending.Add(-1)
		w.dropped.Add(1)
	}
	return len(p), nil
}

func (w *Writer) run(report func(dropped int64)) {
	for line := range w.lines {
		if n := w.dropped.Swap(0); n > 0 && report != nil {
			report(n)
		}
		_, _ = w.out.Write(line)
		w.pending.Add(-1)
	}
}

// Flush waits until every queued line is written, or timeout passed: at
// a process's exit, its last lines.
func (w *Writer) Flush(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for w.pending.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
