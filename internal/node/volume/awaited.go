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

// awaited is the first waiting stage of a volume, and how many wait.
type awaited struct {
	AwaitedPromotion
	stages int
}

// AwaitPromotion records a stage of volume id waiting for its promotion
// past after, until done is called.
func (m *Manager) AwaitPromotion(id string, after uint64) (done func()) {
	a := &m.awaited
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting == nil {
		a.waiting = map[string]*awaited{}
	}
	w, ok := a.waiting[id]
	if !ok {
		w = &awaited{AwaitedPromotion: AwaitedPromotion{VolumeID: id, AfterGeneration: after, Since: time.Now()}}
		a.waiting[id] = w
	}
	w.stages++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if w.stages--; w.stages == 0 {
				delete(a.waiting, id)
			}
		})
	}
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
