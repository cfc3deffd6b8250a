package logqueue

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stuckReader is a log reader that reads nothing until released, as a
// CO's log collector that stopped.
type stuckReader struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (r *stuckReader) Write(p []byte) (int, error) {
	<-r.release
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *stuckReader) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// TestAStuckReaderNeverBlocksAWriter: while the reader reads nothing,
// every Write returns at once; lines beyond the queue are dropped, and
// once the reader is back the queued lines arrive in order, the report of
// how many were dropped called before them: every line is written or
// reported.
func TestAStuckReaderNeverBlocksAWriter(t *testing.T) {
	tests := []struct {
		name        string
		capacity    int
		lines       int
		wantDropped bool
	}{
		{"fewer lines than the queue", 8, 5, false},
		{"more lines than the queue", 4, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &stuckReader{release: make(chan struct{})}
			w := New(out, tt.capacity)
			var reported atomic.Int64
			w.Start(func(n int64) { reported.Add(n) })
			done := make(chan struct{})
			go func() {
				for i := range tt.lines {
					w.Write([]byte("line " + string(rune('a'+i)) + "\n"))
				}
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Write blocked while the reader read nothing")
			}
			close(out.release)
			w.Flush(5 * time.Second)
			got := out.String()
			written := int64(strings.Count(got, "\n"))
			if !strings.HasPrefix(got, "line a\n") {
				t.Fatalf("wrote %q, want the first line first, queued before the queue filled", got)
			}
			if dropped := reported.Load(); (dropped > 0) != tt.wantDropped || written+dropped != int64(tt.lines) {
				t.Fatalf("wrote %d lines and reported %d dropped, want %d in all (dropped: %v)", written, dropped, tt.lines, tt.wantDropped)
			}
		})
	}
}

// TestFlushWaitsForTheQueuedLines: Flush returns once every queued line
// is written, and gives up at its timeout while the reader is stuck.
func TestFlushWaitsForTheQueuedLines(t *testing.T) {
	out := &stuckReader{release: make(chan struct{})}
	w := New(out, 8)
	w.Start(nil)
	w.Write([]byte("last words\n"))
	start := time.Now()
	w.Flush(50 * time.Millisecond)
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("Flush returned after %s with the reader stuck, want its timeout", waited)
	}
	close(out.release)
	w.Flush(5 * time.Second)
	if got := out.String(); got != "last words\n" {
		t.Fatalf("after Flush the reader has %q, want the queued line", got)
	}
}
