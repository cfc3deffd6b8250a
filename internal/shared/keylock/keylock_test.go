package keylock

import (
	"context"
	"testing"
	"time"
)

func TestTryLockAndLock(t *testing.T) {
	var l Locks
	unlock, ok := l.TryLock("a")
	if !ok {
		t.Fatal("first TryLock failed")
	}
	if _, ok := l.TryLock("a"); ok {
		t.Fatal("second TryLock on a held key succeeded")
	}
	if u, ok := l.TryLock("b"); !ok {
		t.Fatal("another key is blocked")
	} else {
		u()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "a"); err == nil {
		t.Fatal("Lock on a held key did not wait for the context")
	}
	got := make(chan struct{})
	go func() {
		u, err := l.Lock(context.Background(), "a")
		if err == nil {
			u()
		}
		close(got)
	}()
	unlock()
	unlock() // a second call is harmless
	select {
	case <-got:
	case <-time.After(time.Second):
		t.Fatal("waiter not woken by unlock")
	}
}
