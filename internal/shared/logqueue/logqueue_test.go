package logqueue

import (
	"bytes"
	"strings"
	"sync"
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
// once the reader is back the queued lines arrive in order, after a line
// that says how many were dropped.
func TestAStuckReaderNeverBlocksAWriter(t *testing.T) {
	tests := []struct {
		name        string
		capacity    int
		lines       int
		wantDropped string // in the report line; "" for none
	}{
		{"fewer lines than the queue", 8, 5, ""},
		{"more lines than the queue", 4, 10, "dropped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &stuckReader{release: make(chan struct{})}
			w := New(out, tt.capacity)
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
			if tt.wantDropped == "" {
				if strings.Contains(got, "dropped") || strings.Count(got, "\n") != tt.lines {
					t.Fatalf("wrote %q, want the %d lines and no report", got, tt.lines)
				}
				return
			}
			if !strings.Contains(got, "log lines were dropped") {
				t.Fatalf("wrote %q, want a line reporting the dropped lines", got)
			}
			if !strings.Contains(got, "line a\n") {
				t.Fatalf("wrote %q, want the first line, queued before the queue filled", got)
			}
		})
	}
}

// TestFlushWaitsForTheQueuedLines: Flush returns once every queued line
// is written, and gives up at its timeout while the reader is stuck.
func TestFlushWaitsForTheQueuedLines(t *testing.T) {
	out := &stuckReader{release: make(chan struct{})}
	w := New(out, 8)
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
