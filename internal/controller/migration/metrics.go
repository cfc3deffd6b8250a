package migration

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// Metrics are the controller's migration metrics.
type Metrics struct {
	events, moveSeconds, catchUps, catchUpsRunning, finalPending, ahead, flushes metrics.Vec
	steps, rpo, promotion                                                        metrics.HistogramVec
}

// stepBuckets are the upper bounds of a move step's duration, in
// seconds: a final step of a few MiB takes seconds, a catch-up of a large
// volume an hour or more.
var stepBuckets = []float64{0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}

// rpoBuckets are the upper bounds of a failover's recovery point, in
// seconds: a replica pushed every minute loses a minute or two, one whose
// pushes failed for a day a day.
var rpoBuckets = []float64{10, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 86400, 7 * 86400}

// NewMetrics declares the migration metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		events:      r.Counter("zfs_nomad_migrations_total", "Moves, failovers and stale primaries set aside, by result.", "kind", "result"),
		moveSeconds: r.Counter("zfs_nomad_move_seconds_total", "Time spent in successful planned moves."),
		rpo: r.Histogram("zfs_nomad_failover_rpo_seconds", "Age of the snapshot each failover promoted: writes in this window on the lost primary are gone (the log names the volume and the snapshot).",
			rpoBuckets),
		promotion: r.Histogram("zfs_nomad_failover_promotion_seconds", "How long each failover's promotion took, once the replica was chosen: the reservation of its generation on a majority (which waits for the silent nodes' leases to run out) and the promotion on its node.",
			stepBuckets),
		catchUps:        r.Counter("zfs_nomad_move_catchups_total", "Background pushes that caught a move's target up before its final step, by result.", "result"),
		catchUpsRunning: r.Gauge("zfs_nomad_move_catchups_running", "Background pushes catching a move's target up now."),
		finalPending:    r.Gauge("zfs_nomad_move_final_step_pending", "1 while a move's target is caught up and the move waits for the publish retry that runs its final step.", "volume_id", "target"),
		steps: r.Histogram("zfs_nomad_move_step_seconds", "How long the successful steps of moves took: catch_up (the background push to a target that was not fresh), final (fence, last increment, promotion).",
			stepBuckets, "step"),
		ahead:   r.Counter("zfs_nomad_publishes_ahead_total", "Publishes granted ahead of the end of the volume's background move to the node, whose stage waits for the move."),
		flushes: r.Counter("zfs_nomad_unpublish_flushes_total", "Pushes of a volume to a replica right after its unpublish from its primary's node, by result: ok, failed (the replica is left to the schedule) or cancelled (a move of the volume went first).", "result"),
	}
}

func (m *Metrics) flushed(result string) {
	if m != nil {
		m.flushes.Add(1, result)
	}
}

func (m *Metrics) publishedAhead() {
	if m != nil {
		m.ahead.Add(1)
	}
}

// finalStepPending records that j's move waits for its final step (pending)
// or no longer does.
func (m *Metrics) finalStepPending(j *moveJob, pending bool) {
	if m == nil {
		return
	}
	if pending {
		m.finalPending.Set(1, j.volumeID, j.target)
	} else {
		m.finalPending.Delete(j.volumeID, j.target)
	}
}

func (m *Metrics) catchUpStarted() {
	if m != nil {
		m.catchUpsRunning.Add(1)
	}
}

func (m *Metrics) catchUpEnded(result string, took time.Duration) {
	if m != nil {
		m.catchUpsRunning.Add(-1)
		m.catchUps.Add(1, result)
		if result == "ok" {
			m.steps.Observe(took.Seconds(), "catch_up")
		}
	}
}

func (m *Metrics) count(kind, result string) {
	if m != nil {
		m.events.Add(1, kind, result)
	}
}

func (m *Metrics) observeMove(d time.Duration) {
	if m != nil {
		m.moveSeconds.Add(d.Seconds())
		m.steps.Observe(d.Seconds(), "final")
	}
}

// failedOver records a failover's recovery point and how long its
// promotion took.
func (m *Metrics) failedOver(rpo, promotion time.Duration) {
	if m != nil {
		m.rpo.Observe(rpo.Seconds())
		m.promotion.Observe(promotion.Seconds())
	}
}
