package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// DefaultMinRate is the average rate, in bytes per second, below which a
// sender loses its receive (Receiver.MinRate): far below any link a
// replica is kept over (a push on an idle guest runs at 8 MiB/s), and high
// enough that a trickling peer cannot keep a replica's lock for long.
const DefaultMinRate = 64 << 10

// errSlow ends a receive whose sender kept it waiting longer than its
// credit allows.
var errSlow = errors.New("the sender stalled: it kept the receive waiting longer than its average rate allows")

// stallGuard bounds the time a receive waits for its sender, which is
// the time a sender can keep the receive, and with it the replica's lock
// and a receive slot, without sending (docs/safety.md, "A receive and the
// lock"):
//
//   - each wait for one message lasts at most idle (errIdle);
//   - all waits together spend a credit that starts at idle, grows by one
//     second per minRate bytes received and never exceeds twice idle:
//     a sender whose average rate stays below minRate runs out of it
//     (errSlow). A stream that arrives faster than minRate is never cut,
//     whatever its pauses shorter than idle.
//
// Only the waits in Recv count: while the receiver is busy (its checks,
// zfs receive writing slowly) the sender is held by flow control, and
// that is not the sender's time. When the credit runs out, cancel ends
// the receive's context with the cause.
type stallGuard struct {
	idle    time.Duration
	minRate float64 // bytes per second; 0: no rate, only idle
	cancel  context.CancelCauseFunc

	mu     sync.Mutex
	timer  *time.Timer
	credit time.Duration
	since  time.Time     // when the running wait began; zero when none runs
	wait   time.Duration // how long the running wait may last
	slow   bool          // the credit, not idle, bounds the running wait
}

func newStallGuard(idle time.Duration, minRate uint64, cancel context.CancelCauseFunc) *stallGuard {
	g := &stallGuard{idle: idle, minRate: float64(minRate), cancel: cancel, credit: idle}
	g.timer = time.AfterFunc(time.Hour, g.expire)
	g.timer.Stop()
	return g
}

// waiting starts a wait for the sender's next message.
func (g *stallGuard) waiting() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wait, g.slow = g.idle, false
	if g.minRate > 0 && g.credit < g.wait {
		g.wait, g.slow = max(g.credit, 0), true
	}
	g.since = time.Now()
	g.timer.Reset(g.wait)
}

// got ends the wait, which brought n bytes.
func (g *stallGuard) got(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timer.Stop()
	if g.since.IsZero() {
		return
	}
	g.credit -= time.Since(g.since)
	g.since = time.Time{}
	if g.minRate > 0 {
		g.credit = min(g.credit+time.Duration(float64(n)/g.minRate*float64(time.Second)), 2*g.idle)
	}
}

// expire ends the receive when the running wait has lasted its time (a
// timer that fired as one wait ended and the next began is ignored).
func (g *stallGuard) expire() {
	g.mu.Lock()
	over := !g.since.IsZero() && time.Since(g.since) >= g.wait
	cause := fmt.Errorf("%w (%s)", errIdle, g.idle)
	if g.slow {
		cause = fmt.Errorf("%w (%d bytes per second on average at least, and a message every %s)", errSlow, uint64(g.minRate), g.idle)
	}
	g.mu.Unlock()
	if over {
		g.cancel(cause)
	}
}

// stop ends the guard: nothing is waited for any more.
func (g *stallGuard) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timer.Stop()
	g.since = time.Time{}
}

// header reads the stream's header within what the guard allows.
func (g *stallGuard) header(ctx context.Context, in Incoming) (Header, error) {
	g.waiting()
	defer g.got(0)
	return within(ctx, in.Header)
}

// read reads the next bytes of the stream into p within what the guard
// allows. When it gives up, the read may still write into p: the caller
// drops p with the stream.
func (g *stallGuard) read(ctx context.Context, in Incoming, p []byte) (int, error) {
	g.waiting()
	n, err := within(ctx, func() (int, error) { return in.Read(p) })
	g.got(n)
	return n, err
}

// within runs a blocking read, or gives up when ctx ends: the caller then
// returns, which ends the stream and with it the read, whose result is
// dropped.
func within[T any](ctx context.Context, read func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := read()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, errdefs.Wrap(errdefs.ErrAborted, "%v", context.Cause(ctx))
	}
}
