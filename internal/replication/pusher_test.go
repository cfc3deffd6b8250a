package replication

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// stuckHold is a Streams whose Hold waits until its context ends, like a
// tidy caught in a slow pool sync.
type stuckHold struct {
	Streams
	entered chan struct{}
	calls   atomic.Int32
	ended   atomic.Bool
}

func (s *stuckHold) Hold(ctx context.Context, _, _ string) error {
	if s.calls.Add(1) == 1 {
		close(s.entered)
	}
	<-ctx.Done()
	s.ended.Store(true)
	return ctx.Err()
}

// TestHoldStopsAndWaitsForTidy: a delete (which holds transfers) must not
// run while the tidy after a push still holds or prunes the volume's
// snapshots.
func TestHoldStopsAndWaitsForTidy(t *testing.T) {
	z := &stuckHold{entered: make(chan struct{})}
	p := NewPusher(z, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	p.startTidy(id, fs, fs+"@zn-1", BaseHoldTag+"-n2", hclog.NewNullLogger())
	<-z.entered

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release, err := p.Hold(ctx, id)
	if err != nil {
		t.Fatalf("Hold did not stop the tidy: %v", err)
	}
	defer release()
	if !z.ended.Load() {
		t.Fatal("Hold returned while the tidy still ran")
	}
	// While held, a tidy (of a push that raced the hold) is skipped.
	p.startTidy(id, fs, fs+"@zn-2", BaseHoldTag+"-n2", hclog.NewNullLogger())
	time.Sleep(100 * time.Millisecond)
	if n := z.calls.Load(); n != 1 {
		t.Errorf("a tidy ran while the volume was held (%d holds tried)", n)
	}
}

func TestReceiverSaidWhy(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Aborted, "a receive of volume v is running; retry"), true},
		{status.Error(codes.FailedPrecondition, "refusing to overwrite a primary"), true},
		{status.Error(codes.Unavailable, "connection reset"), false},
		{status.Error(codes.Canceled, "context canceled"), false},
		{errors.New("EOF"), false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := receiverSaidWhy(tt.err); got != tt.want {
			t.Errorf("receiverSaidWhy(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
