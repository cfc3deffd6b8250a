package replication

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestLimiterPacesAllSendersTogether(t *testing.T) {
	l := NewLimiter(10 << 20) // 10 MiB/s
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ { // two pushes share the node's limit
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 3; j++ {
				if err := l.Wait(context.Background(), 1<<20); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	// 6 MiB at 10 MiB/s: the last chunk may start after 0.5 s.
	if elapsed := time.Since(start); elapsed < 450*time.Millisecond || elapsed > 2*time.Second {
		t.Errorf("6 chunks of 1 MiB at 10 MiB/s took %s, want about 0.5 s", elapsed)
	}
	var unlimited *Limiter
	if err := unlimited.Wait(context.Background(), 1<<30); err != nil {
		t.Error(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	slow := NewLimiter(1)
	slow.Wait(ctx, 10)
	if err := slow.Wait(ctx, 10); err == nil {
		t.Error("Wait ignored a cancelled context")
	}
}
