// Package copylock is the one lock of each volume's copy on a node
// (docs/safety.md, "One owner of a copy"). Every change to a copy runs
// under it, whichever part of the node makes the change: creating,
// staging, fencing, promoting, demoting, setting aside and deleting
// (volume.Manager), a push's snapshot and the tidy after it
// (replication.Pusher), a receive, the tidy after it and deleting a
// replica (replication.Receiver). With one lock per copy there is no
// second lock to take in another order, and no change can interleave
// with another.
//
// A push streams its zfs send outside the lock (a send only reads, and may
// run for hours): it registers as the volume's transfer instead, which a
// change that ends the copy's life (delete, demote) stops, holding the
// lock, before it goes on.
package copylock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
)

// DefaultWait bounds how long Lock waits for the change that holds a
// copy's lock. Every change but a receive takes a few pool syncs; a
// receive may take long, and whoever waits for it gets Aborted, names it,
// and retries.
const DefaultWait = 10 * time.Second

// Locks holds the locks of one node's copies, by volume ID (or snapshot
// ID, for a CSI snapshot's own operations). The zero value is ready to use.
type Locks struct {
	// Wait, when set, replaces DefaultWait: the fault simulation, whose
	// steps are seconds of its own clock run in milliseconds, waits for
	// a busy lock within one step as a node waits within one beat.
	Wait time.Duration

	keys keylock.Locks

	mu        sync.Mutex
	holders   map[string]holder    // what holds each lock, for who waits
	transfers map[string]*transfer // the running transfer of each volume
	// taken counts, per copy, the times its lock was taken (Mark). One
	// number per volume ID this node ever locked: never removed, since a
	// count that restarted could match an old mark.
	taken map[string]uint64
}

type holder struct {
	what  string
	since time.Time
}

type transfer struct {
	what   string
	cancel context.CancelFunc
	done   chan struct{}
}

// Lock takes the lock of id's copy for the change what (a few words, such
// as "receive from node n2"), waiting until ctx ends or for Wait at most.
// A change that does not get it answers Aborted, naming what holds it.
func (l *Locks) Lock(ctx context.Context, id, what string) (unlock func(), err error) {
	wctx, cancel := context.WithTimeout(ctx, cmp.Or(l.Wait, DefaultWait))
	defer cancel()
	release, err := l.keys.Lock(wctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %s of %s waited for %s: retry", errdefs.ErrAborted, what, id, l.holding(id))
	}
	l.mu.Lock()
	if l.holders == nil {
		l.holders, l.taken = map[string]holder{}, map[string]uint64{}
	}
	l.holders[id] = holder{what: what, since: time.Now()}
	l.taken[id]++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.holders, id)
			l.mu.Unlock()
			release()
		})
	}, nil
}

// holding says what holds id's lock, for an error message.
func (l *Locks) holding(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holders[id]
	if !ok {
		return "another change"
	}
	return fmt.Sprintf("%s (running for %s)", h.what, time.Since(h.since).Round(time.Millisecond))
}

// Held reports whether someone holds id's lock, and what: for checks that
// no copy changes without it.
func (l *Locks) Held(id string) (what string, held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, held := l.holders[id]
	return h.what, held
}

// Mark is for reading a copy before taking its lock (a receive reads
// what it holds while its sender starts, and takes the lock only once
// the stream's first record is in hand). Call it before the read: free
// says that nobody holds the lock now. Once the caller holds the lock,
// Unchanged(id, mark) tells whether what it read is still true.
func (l *Locks) Mark(id string) (mark uint64, free bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, held := l.holders[id]
	return l.taken[id], !held
}

// Unchanged reports, to a caller holding id's lock, that nobody else took
// the lock since Mark answered mark with free: every change of a copy
// holds its lock (I5), so a read made after that Mark still holds.
func (l *Locks) Unchanged(id string, mark uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.taken[id] == mark+1
}

// Busy reports whether any copy's lock is held: a change may be half
// done.
func (l *Locks) Busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.holders) > 0
}

// ErrTransferRunning is wrapped by StartTransfer's answer when the volume
// has a transfer running already.
var ErrTransferRunning = errors.New("a transfer is running")

// StartTransfer registers a transfer of id that runs outside the lock (a
// push's zfs send). Its context ends when the caller's does or when a
// change that ends the copy's life stops it (StopTransfer); end must be
// called once it is over. A volume has one transfer at a time: another
// answers Aborted.
func (l *Locks) StartTransfer(ctx context.Context, id, what string) (context.Context, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.transfers[id]; ok {
		return nil, nil, fmt.Errorf("%w: %w: %s of %s while %s runs", errdefs.ErrAborted, ErrTransferRunning, what, id, t.what)
	}
	if l.transfers == nil {
		l.transfers = map[string]*transfer{}
	}
	tctx, cancel := context.WithCancel(ctx)
	t := &transfer{what: what, cancel: cancel, done: make(chan struct{})}
	l.transfers[id] = t
	var once sync.Once
	return tctx, func() {
		once.Do(func() {
			cancel()
			l.mu.Lock()
			delete(l.transfers, id)
			l.mu.Unlock()
			close(t.done)
		})
	}, nil
}

// StopTransfer stops id's running transfer, if any, and waits until it is
// over. The caller holds id's lock: a transfer started meanwhile waits
// for it at its first change (a push's snapshot), and then finds the copy
// as the caller left it.
func (l *Locks) StopTransfer(ctx context.Context, id string) error {
	l.mu.Lock()
	t, ok := l.transfers[id]
	l.mu.Unlock()
	if !ok {
		return nil
	}
	t.cancel()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for %s of %s to stop: %v", errdefs.ErrAborted, t.what, id, ctx.Err())
	}
}
