package replication

import (
	"context"
	"sync"
	"time"
)

// Limiter paces the bytes a node sends, shared by all its pushes: each
// chunk is scheduled after the previous ones at the configured rate. A nil
// Limiter, or one with rate 0, does not limit.
type Limiter struct {
	rate float64 // bytes per second

	mu   sync.Mutex
	next time.Time // when the link is free again
}

// NewLimiter returns a limiter of bytesPerSecond (0: unlimited).
func NewLimiter(bytesPerSecond uint64) *Limiter {
	return &Limiter{rate: float64(bytesPerSecond)}
}

// Wait blocks until n more bytes may be sent, or ctx ends.
func (l *Limiter) Wait(ctx context.Context, n int) error {
	if l == nil || l.rate == 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	start := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	delay := time.Until(start)
	if delay <= 0 {
		return nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
