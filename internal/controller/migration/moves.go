package migration

import (
	"encoding/json"
	"net/http"
	"sort"
	"time"
)

// MoveStatus is a move the controller runs in the background: catching
// its target up, or running its final step, or done and waiting for the
// CO's retry of the publish (docs/migration.md, "Catch-up").
type MoveStatus struct {
	VolumeID   string    `json:"volume_id"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	Started    time.Time `json:"started"`
	Bytes      int64     `json:"bytes"`
	TotalBytes int64     `json:"total_bytes,omitempty"`
	// FinalStep: the final step (fence, last increment, promotion) runs,
	// or ran.
	FinalStep bool `json:"final_step,omitempty"`
	// Moved: when the final step moved the volume; the CO's retry finds
	// it on the target.
	Moved time.Time `json:"moved,omitzero"`
	// CaughtUp: when the catch-up completed with the source still
	// published; the final step waits for the publish's retry since then.
	CaughtUp time.Time `json:"caught_up,omitzero"`
	// NothingToMove: when the final step found the volume published
	// again on its source, or no longer its primary there; the CO's retry
	// decides afresh.
	NothingToMove time.Time `json:"nothing_to_move,omitzero"`
	// PublishedAhead: when the publish was granted ahead of the move's
	// end; the node's stage waits for the promotion since then.
	PublishedAhead time.Time `json:"published_ahead,omitzero"`
	// Error: why the catch-up failed (the publish's retry starts another).
	Error string `json:"error,omitempty"`
}

// Moves returns the catch-ups running, and those done (within
// catchUpKeep) whose move the CO's retry has not yet finished, by volume
// and target.
func (m *Migrator) Moves() []MoveStatus {
	now := m.now()
	m.jobs.mu.Lock()
	defer m.jobs.mu.Unlock()
	out := make([]MoveStatus, 0, len(m.jobs.all))
	for _, j := range m.jobs.all {
		j.mu.Lock()
		if !j.ended.IsZero() && now.Sub(j.ended) > catchUpKeep {
			j.mu.Unlock()
			continue // the CO gave up on it, or went elsewhere
		}
		s := MoveStatus{VolumeID: j.volumeID, From: j.source, To: j.target, Started: j.started, Bytes: j.bytes, TotalBytes: j.total, FinalStep: j.step == finalStep, PublishedAhead: j.publishedAhead}
		switch j.outcome {
		case failed:
			s.Error = j.err.Error()
		case moved:
			s.Moved = j.ended
		case caughtUp:
			s.CaughtUp = j.ended
		case nothingToMove:
			s.NothingToMove = j.ended
		}
		j.mu.Unlock()
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VolumeID != out[j].VolumeID {
			return out[i].VolumeID < out[j].VolumeID
		}
		return out[i].To < out[j].To
	})
	return out
}

// MovesPath is where the controller serves Moves, on its metrics address:
// zfs-controller status reads it there.
const MovesPath = "/moves"

// MovesHandler serves Moves as JSON.
func (m *Migrator) MovesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(m.Moves())
	})
}
