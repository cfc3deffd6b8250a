package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestHealthReadings: a reading answers for maxAge and no longer, a
// failed reading is kept like a good one, and a reading cut short by its
// context is not kept.
func TestHealthReadings(t *testing.T) {
	degraded := errors.New("pool tank is DEGRADED")
	now := time.Unix(1000, 0)
	var reads int
	var result error
	h := newHealthReadings(func(ctx context.Context) error {
		reads++
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return result
	}, time.Second, func() time.Time { return now })
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	steps := []struct {
		name      string
		ctx       context.Context
		advance   time.Duration
		result    error
		want      error
		wantReads int
	}{
		{"the first check reads", context.Background(), 0, nil, nil, 1},
		{"within maxAge the reading answers", context.Background(), 999 * time.Millisecond, degraded, nil, 1},
		{"at maxAge it reads again", context.Background(), time.Millisecond, degraded, degraded, 2},
		{"a failed reading is kept too", context.Background(), 500 * time.Millisecond, nil, degraded, 2},
		{"a reading cut short is returned", cancelled, 500 * time.Millisecond, nil, context.Canceled, 3},
		{"and not kept", context.Background(), 0, nil, nil, 4},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		result = s.result
		if err := h.Check(s.ctx); !errors.Is(err, s.want) || (s.want == nil && err != nil) {
			t.Errorf("%s: Check = %v, want %v", s.name, err, s.want)
		}
		if reads != s.wantReads {
			t.Errorf("%s: %d readings, want %d", s.name, reads, s.wantReads)
		}
	}
}
