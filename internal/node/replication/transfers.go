package replication

import (
	"sync"
	"time"
)

// Transfer is a push in progress.
type Transfer struct {
	VolumeID string
	Peer     string
	Purpose  string // why it runs, as its requester said
	Started  time.Time
	Progress
}

// Transfers returns the pushes running now.
func (p *Pusher) Transfers() []Transfer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Transfer
	for _, t := range p.transfers {
		out = append(out, *t)
	}
	return out
}

func (p *Pusher) track(volumeID string, t *Transfer) (untrack func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.transfers == nil {
		p.transfers = map[string]*Transfer{}
	}
	p.transfers[volumeID] = t
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.transfers, volumeID)
	}
}

func (p *Pusher) update(t *Transfer, prog Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Progress = prog
}

// reportEvery calls f every interval until stop is called.
func (p *Pusher) reportEvery(interval time.Duration, f func()) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f()
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}
