package volume

import (
	"sort"
	"sync"
	"time"
)

// AwaitedPromotion is a stage on this node that waits for its copy of a
// volume to be promoted past a generation: a publish granted ahead of
// the end of the volume's move here (docs/migration.md, "Publishing
// ahead of a move's end").
type AwaitedPromotion struct {
	VolumeID        string
	AfterGeneration uint64
	Since           time.Time
}

// awaitedPromotions are the stages waiting now. They tell the controller
// that a move granted ahead is wanted here: if the instance that started
// it died, the instance holding the work lease finishes it
// (migration.FinishAwaitedMoves). In memory: a stage lasts one call.
type awaitedPromotions struct {
	mu      sync.Mutex
	waiting map[string]*awaited // by volume ID
}

// awaited is the first waiting stage of a volume, how many wait, and
// the channel that wakes them when this node promotes its copy.
type awaited struct {
	AwaitedPromotion
	stages   int
	promoted chan struct{}
}

// AwaitPromotion records a stage of volume id waiting for its promotion
// past after, until done is called. The channel it returns is closed
// when this node promotes its copy of id (Promote), so the stage looks at
// once instead of at its next poll; a promotion before this call does
// not close it.
func (m *Manager) AwaitPromotion(id string, after uint64) (promoted <-chan struct{}, done func()) {
	a := &m.awaited
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting == nil {
		a.waiting = map[string]*awaited{}
	}
	w, ok := a.waiting[id]
	if !ok {
		w = &awaited{AwaitedPromotion: AwaitedPromotion{VolumeID: id, AfterGeneration: after, Since: time.Now()}, promoted: make(chan struct{})}
		a.waiting[id] = w
	}
	w.stages++
	var once sync.Once
	return w.promoted, func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if w.stages--; w.stages == 0 {
				delete(a.waiting, id)
			}
		})
	}
}

// wakeAwaited wakes the stages that wait for volume id's promotion: this
// node promoted its copy. They stay listed until they end; stages that
// start waiting later get a new channel.
func (m *Manager) wakeAwaited(id string) {
	a := &m.awaited
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.waiting[id]
	if !ok {
		return
	}
	close(w.promoted)
	w.promoted = make(chan struct{})
}

// AwaitedPromotions lists the stages waiting for a promotion now, by
// volume ID.
func (m *Manager) AwaitedPromotions() []AwaitedPromotion {
	a := &m.awaited
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]AwaitedPromotion, 0, len(a.waiting))
	for _, w := range a.waiting {
		out = append(out, w.AwaitedPromotion)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out
}
