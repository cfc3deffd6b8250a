package replication

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// trickle returns a stream that sends msgs, then one byte every interval
// until the test ends: a sender that keeps each message within the idle
// timeout but sends nearly nothing.
func trickle(t *testing.T, interval time.Duration, msgs ...message) *fakeStream {
	return paced(t, interval, 1, -1, msgs...)
}

// paced returns a stream that sends msgs, then count messages of size
// bytes, one every interval, and ends (count < 0: goes on until the test
// ends).
func paced(t *testing.T, interval time.Duration, size, count int, msgs ...message) *fakeStream {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan message)
	go func() {
		for _, m := range msgs {
			select {
			case ch <- m:
			case <-ctx.Done():
				return
			}
		}
		for i := 0; count < 0 || i < count; i++ {
			time.Sleep(interval)
			select {
			case ch <- dataMsg(make([]byte, size)):
			case <-ctx.Done():
				return
			}
		}
		close(ch)
	}()
	return &fakeStream{ctx: ctx, msgs: ch}
}

// TestStalledHeaderNeverLocksAPrimary: a peer that sends a header for a
// volume whose copy here is a primary (mounted, staged writable) and then
// stalls, or trickles, is refused at once, before any stream byte, and
// never takes the primary's lock: the self-fence (or a stage, a fence, a
// delete) of that volume, running meanwhile, gets the lock at once
// instead of waiting copylock.DefaultWait and failing Aborted.
func TestStalledHeaderNeverLocksAPrimary(t *testing.T) {
	streams := map[string]func(t *testing.T, kind string) *fakeStream{
		"header, then nothing": func(t *testing.T, kind string) *fakeStream { return stream(t, true, header(kind, 1)) },
		"header, then a byte at a time": func(t *testing.T, kind string) *fakeStream {
			return trickle(t, 10*time.Millisecond, header(kind, 1))
		},
	}
	for name, open := range streams {
		for _, kind := range []string{KindFull, KindIncremental, KindResume} {
			t.Run(name+"/"+kind, func(t *testing.T) {
				z := newMemPool(testRoot)
				z.put(testDataset, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "1", copyrecord.PropVolumeID: testVolume}, "zn-1:41")
				locks := new(copylock.Locks)
				r := NewReceiver(z, locks, nil, testRoot, "n2", 2, hclog.NewNullLogger())
				// As shipped: a stalled sender would otherwise keep the
				// receive for minutes.
				r.IdleTimeout = DefaultIdleTimeout
				received := make(chan error, 1)
				go func() { _, err := receiveFrom(r, open(t, kind)); received <- err }()

				// The self-fence comes while the stalled stream is open.
				time.Sleep(50 * time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				start := time.Now()
				unlock, err := locks.Lock(ctx, testVolume, "self-fence after losing the lease")
				if err != nil {
					t.Fatalf("the self-fence waited %s behind a stalled receive into the primary: %v", time.Since(start).Round(time.Millisecond), err)
				}
				unlock()

				select {
				case err := <-received:
					if status.Code(errdefs.ToStatus(err)) != codes.FailedPrecondition {
						t.Errorf("a stream into a primary: %v, want FailedPrecondition", err)
					}
				case <-time.After(time.Second):
					t.Fatal("a stalled stream into a primary was not refused before its first record")
				}
				if d := z.dataset(testDataset); d.props[copyrecord.PropRole] != contract.RolePrimary || z.receives != 0 {
					t.Errorf("the primary is now %v, with %d zfs receives run", d.props, z.receives)
				}
			})
		}
	}
}

// TestStalledSenderLosesTheReplicaLock: a sender that stalls or trickles
// before the stream's first record never holds the replica's lock; one
// that does so after it holds the lock at most the stall guard's credit
// (at most twice the idle timeout), and loses the receive, Aborted, with
// the lock free again.
func TestStalledSenderLosesTheReplicaLock(t *testing.T) {
	const idle = 300 * time.Millisecond
	first := plainStream(KindIncremental) // the first record and some bytes
	tests := []struct {
		name    string
		open    func(t *testing.T) *fakeStream
		mayLock bool // the first record came: the lock may be taken
	}{
		{"header, then nothing", func(t *testing.T) *fakeStream { return stream(t, true, header(KindIncremental, 5)) }, false},
		{"header, then a byte at a time", func(t *testing.T) *fakeStream {
			return trickle(t, 10*time.Millisecond, header(KindIncremental, 5))
		}, false},
		{"first record, then nothing", func(t *testing.T) *fakeStream { return stream(t, true, header(KindIncremental, 5), first) }, true},
		{"first record, then a byte at a time", func(t *testing.T) *fakeStream {
			return trickle(t, 10*time.Millisecond, header(KindIncremental, 5), first)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &replicaStore{exists: true, generation: 5}
			locks := new(copylock.Locks)
			r := NewReceiver(z, locks, nil, testRoot, "n2", 2, hclog.NewNullLogger())
			r.IdleTimeout = idle
			received := make(chan error, 1)
			start := time.Now()
			go func() { _, err := receiveFrom(r, tt.open(t)); received <- err }()

			// Watch the lock while the receive runs.
			locked := false
			var err error
		watch:
			for {
				select {
				case err = <-received:
					break watch
				case <-time.After(5 * time.Millisecond):
					if _, held := locks.Held(testVolume); held {
						locked = true
					}
				}
				if time.Since(start) > 3*time.Second {
					t.Fatalf("the stalled sender kept its receive for %s (lock held: %v)", time.Since(start).Round(time.Millisecond), locked)
				}
			}
			took := time.Since(start)
			if locked && !tt.mayLock {
				t.Error("a sender stalled before its first record held the replica's lock")
			}
			if bound := 2*idle + 200*time.Millisecond; took > bound {
				t.Errorf("the receive ended after %s, beyond the bound %s", took.Round(time.Millisecond), bound)
			}
			if status.Code(errdefs.ToStatus(err)) != codes.Aborted {
				t.Errorf("the stalled receive ended with %v, want Aborted", err)
			}
			if what, held := locks.Held(testVolume); held {
				t.Errorf("the replica's lock is still held, by %s", what)
			}
		})
	}
}

// TestSlowSenderAboveTheRateKeepsItsReceive: a sender that pauses
// between messages, each pause within the idle timeout, but averages
// more than MinRate, is never cut, however long its stream runs past
// twice the idle timeout.
func TestSlowSenderAboveTheRateKeepsItsReceive(t *testing.T) {
	z := &replicaStore{exists: true, generation: 5}
	r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
	// 1 KiB every 200 ms: 5 KiB/s, for 2.4 s, past twice the idle
	// timeout. Each pause leaves 800 ms to the timeout: room for a
	// machine busy with other tests to be late waking the sender.
	r.IdleTimeout, r.MinRate = time.Second, 4<<10
	_, err := receiveFrom(r, paced(t, 200*time.Millisecond, 1<<10, 12, header(KindIncremental, 5), plainStream(KindIncremental)))
	if err != nil {
		t.Errorf("a sender above the rate: %v", err)
	}
}
