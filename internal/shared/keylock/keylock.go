// Package keylock serialises operations per key (a volume or snapshot ID)
// while letting different keys proceed in parallel.
package keylock

import (
	"context"
	"sync"
)

// Locks is a set of named locks. The zero value is ready to use.
type Locks struct {
	mu   sync.Mutex
	held map[string]chan struct{}
}

// TryLock takes the lock for key if it is free. CSI servers use it to answer
// Aborted to a call that overlaps another on the same volume.
func (l *Locks) TryLock(key string) (unlock func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[string]chan struct{}{}
	}
	if _, busy := l.held[key]; busy {
		return nil, false
	}
	return l.take(key), true
}

// Lock waits for the lock for key until ctx ends.
func (l *Locks) Lock(ctx context.Context, key string) (unlock func(), err error) {
	for {
		l.mu.Lock()
		if l.held == nil {
			l.held = map[string]chan struct{}{}
		}
		wait, busy := l.held[key]
		if !busy {
			unlock := l.take(key)
			l.mu.Unlock()
			return unlock, nil
		}
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// take must be called with l.mu held.
func (l *Locks) take(key string) func() {
	done := make(chan struct{})
	l.held[key] = done
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.held, key)
			l.mu.Unlock()
			close(done)
		})
	}
}
