package replication

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChunkWriterCutsTheStream: through Write or ReadFrom (io.Copy), the
// messages carry the stream in order, the first one of firstChunkSize,
// then chunkSize each and the rest last, and sent counts them all.
func TestChunkWriterCutsTheStream(t *testing.T) {
	tests := []struct {
		name  string
		size  int
		sizes []int
	}{
		{"smaller than the first chunk", 1000, []int{1000}},
		{"the first chunk exactly", firstChunkSize, []int{firstChunkSize}},
		{"two and a half chunks after the first", firstChunkSize + 5*chunkSize/2, []int{firstChunkSize, chunkSize, chunkSize, chunkSize / 2}},
	}
	for _, tt := range tests {
		for _, via := range []string{"Write", "ReadFrom"} {
			t.Run(tt.name+" via "+via, func(t *testing.T) {
				stream := make([]byte, tt.size)
				for i := range stream {
					stream[i] = byte(rand.IntN(256))
				}
				var got [][]byte
				var sent atomic.Int64
				w := newChunkWriter(func(b []byte) error { got = append(got, b); return nil }, &sent)
				var err error
				if via == "Write" {
					// In pieces of odd sizes, as a pipe hands them over.
					for rest := stream; len(rest) > 0 && err == nil; {
						n := min(len(rest), 1+rand.IntN(100<<10))
						_, err = w.Write(rest[:n])
						rest = rest[n:]
					}
				} else {
					_, err = io.Copy(w, bytes.NewReader(stream))
				}
				if err == nil {
					err = w.flush()
				}
				if err != nil {
					t.Fatal(err)
				}
				var sizes []int
				for _, m := range got {
					sizes = append(sizes, len(m))
				}
				if !slices.Equal(sizes, tt.sizes) {
					t.Errorf("messages of %v bytes, want %v", sizes, tt.sizes)
				}
				if !bytes.Equal(bytes.Join(got, nil), stream) {
					t.Error("the messages do not carry the stream as written")
				}
				if sent.Load() != int64(tt.size) {
					t.Errorf("sent counts %d bytes, want %d", sent.Load(), tt.size)
				}
			})
		}
	}
}

// TestChunkWriterReadsWhileItSends: while the first message is on its
// way (its send has not returned), the writer takes the next chunk of
// zfs send: producing the stream and carrying it overlap.
func TestChunkWriterReadsWhileItSends(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	w := newChunkWriter(func([]byte) error { <-release; return nil }, new(atomic.Int64))
	defer once.Do(func() { close(release) })
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(make([]byte, firstChunkSize+chunkSize))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second chunk waited for the first one's send to return")
	}
	once.Do(func() { close(release) })
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
}

// TestChunkWriterStopsAtAFailedSend: a send that fails ends the stream:
// the writes after it and the flush return its error, and nothing more
// is sent.
func TestChunkWriterStopsAtAFailedSend(t *testing.T) {
	broken := errors.New("the stream broke")
	var calls atomic.Int32
	w := newChunkWriter(func([]byte) error {
		if calls.Add(1) == 2 {
			return broken
		}
		return nil
	}, new(atomic.Int64))
	var err error
	for i := 0; i < 10 && err == nil; i++ {
		_, err = w.Write(make([]byte, chunkSize))
	}
	if !errors.Is(err, broken) {
		t.Errorf("writes after the failed send: %v, want its error", err)
	}
	if err := w.flush(); !errors.Is(err, broken) {
		t.Errorf("flush: %v, want the failed send's error", err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d sends, want 2 (none after the failure)", n)
	}
	w.stop() // again: no effect
}
