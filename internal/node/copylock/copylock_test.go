package copylock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

const id = "vol-0123456789abcdef0123"

// TestLockNamesWhatHoldsIt: a change that waits too long is Aborted, and
// its message says which change holds the copy.
func TestLockNamesWhatHoldsIt(t *testing.T) {
	var l Locks
	unlock, err := l.Lock(context.Background(), id, "receive from node n1")
	if err != nil {
		t.Fatal(err)
	}
	if what, held := l.Held(id); !held || what != "receive from node n1" {
		t.Errorf("Held = %q, %v", what, held)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = l.Lock(ctx, id, "promote")
	if !errors.Is(err, errdefs.ErrAborted) || !strings.Contains(err.Error(), "receive from node n1") {
		t.Errorf("a promote waiting for a receive: %v, want Aborted naming the receive", err)
	}
	unlock()
	unlock() // twice is harmless
	if _, held := l.Held(id); held {
		t.Error("still held after unlock")
	}
	if unlock, err := l.Lock(context.Background(), id, "promote"); err != nil {
		t.Errorf("free lock: %v", err)
	} else {
		unlock()
	}
}

// TestLockSerialises: a second change waits for the first and then runs.
func TestLockSerialises(t *testing.T) {
	var l Locks
	unlock, _ := l.Lock(context.Background(), id, "first")
	got := make(chan string, 1)
	go func() {
		second, err := l.Lock(context.Background(), id, "second")
		if err != nil {
			got <- err.Error()
			return
		}
		what, _ := l.Held(id)
		second()
		got <- what
	}()
	select {
	case g := <-got:
		t.Fatalf("the second change ran while the first held the lock: %s", g)
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	if g := <-got; g != "second" {
		t.Errorf("the second change got %q", g)
	}
	// Other copies are not held up.
	a, _ := l.Lock(context.Background(), id, "a")
	defer a()
	b, err := l.Lock(context.Background(), "vol-ffffffffffffffffffff", "b")
	if err != nil {
		t.Fatalf("another copy's lock: %v", err)
	}
	b()
}

// TestTransfers: one transfer per volume; StopTransfer cancels it and
// returns once it is over; then another may start.
func TestTransfers(t *testing.T) {
	var l Locks
	ctx := context.Background()
	if err := l.StopTransfer(ctx, id); err != nil {
		t.Fatalf("stopping no transfer: %v", err)
	}
	tctx, end, err := l.StartTransfer(ctx, id, "a push to n2")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.StartTransfer(ctx, id, "a push to n3"); !errors.Is(err, errdefs.ErrAborted) || !errors.Is(err, ErrTransferRunning) {
		t.Errorf("a second transfer: %v, want Aborted", err)
	}
	ended := make(chan struct{})
	go func() {
		<-tctx.Done()
		time.Sleep(50 * time.Millisecond) // winding down
		close(ended)
		end()
	}()
	if err := l.StopTransfer(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	default:
		t.Fatal("StopTransfer returned before the transfer was over")
	}
	_, end2, err := l.StartTransfer(ctx, id, "a push to n3")
	if err != nil {
		t.Fatalf("a transfer after the stopped one: %v", err)
	}
	end2()

	// A transfer that does not end keeps StopTransfer only until its ctx.
	_, end3, _ := l.StartTransfer(ctx, id, "a push to n4")
	defer end3()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := l.StopTransfer(short, id); !errors.Is(err, errdefs.ErrAborted) {
		t.Errorf("stopping a transfer that hangs: %v, want Aborted", err)
	}
}

// TestUnchanged: a read made after Mark holds under the lock taken next,
// unless someone else took the lock in between; Mark says when the lock
// is held at the time (a change may be half done).
func TestUnchanged(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		between func(l *Locks) // after the Mark, before the caller's Lock
		want    bool
	}{
		{"nobody took it", func(*Locks) {}, true},
		{"another change came and went", func(l *Locks) {
			unlock, _ := l.Lock(ctx, id, "promote")
			unlock()
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Locks
			mark, free := l.Mark(id)
			if !free {
				t.Fatal("Mark: a lock nobody took is not free")
			}
			tt.between(&l)
			unlock, err := l.Lock(ctx, id, "receive")
			if err != nil {
				t.Fatal(err)
			}
			if _, free := l.Mark(id); free {
				t.Error("Mark: a held lock is free")
			}
			if got := l.Unchanged(id, mark); got != tt.want {
				t.Errorf("Unchanged = %v, want %v", got, tt.want)
			}
			unlock()
		})
	}
}
