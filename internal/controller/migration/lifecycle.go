package migration

import (
	"context"
	"sync"
	"time"
)

// lifecycle is the migrator's background work: the moves that run apart
// from the publish that started them, and the demotion after a move. A
// controller that exits takes them with it; Stop does the same in a
// process that goes on (the fault simulation's controller crash), so a
// dead controller's goroutines never act after its successor started.
type lifecycle struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (l *lifecycle) init() {
	l.once.Do(func() { l.ctx, l.cancel = context.WithCancel(context.Background()) })
}

// context is the parent of every background call: it ends with Stop.
func (l *lifecycle) context() context.Context {
	l.init()
	return l.ctx
}

// spawn runs f in the background, counted for Stop.
func (l *lifecycle) spawn(f func()) {
	l.init()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// Stop cancels the migrator's background work and waits for it to end.
func (m *Migrator) Stop() {
	m.background.init()
	m.background.cancel()
	m.background.wg.Wait()
}

// SetClock sets the clock the migrator judges ages and estimates by (the
// wall clock by default): the fault simulation's own.
func (m *Migrator) SetClock(now func() time.Time) { m.now = now }
