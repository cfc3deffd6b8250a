//go:build linux && cgo

package libzfs

import (
	"context"
	"errors"
	"testing"
	"time"
)

// With every handle in use, a call waits for one and gives up when its
// context ends; once a handle is back, calls go through again.
func TestCallsWaitForAFreeHandle(t *testing.T) {
	z, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	release := make(chan struct{})
	busy := make(chan struct{}, poolSize)
	done := make(chan error, poolSize)
	for range poolSize {
		go func() {
			done <- z.do(ctx, func(handle) error {
				busy <- struct{}{}
				<-release
				return nil
			})
		}()
	}
	for range poolSize {
		<-busy
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := z.do(short, func(handle) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call with every handle busy: %v, want it to give up when its context ends", err)
	}
	// go-libzfs's handle is not in the pool: its calls still go through.
	if Binding == "go-libzfs" {
		if err := z.ReleaseAll(ctx, "nosuchpool/v@s"); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("ReleaseAll with the pool busy: %v, want the snapshot-missing error", err)
		}
	}
	close(release)
	for range poolSize {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := z.do(ctx, func(handle) error { return nil }); err != nil {
		t.Errorf("call after the handles came back: %v", err)
	}
}
