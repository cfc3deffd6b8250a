package migration

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/metrics"
)

// Metrics are the controller's migration metrics.
type Metrics struct {
	events, moveSeconds, rpo metrics.Vec
}

// NewMetrics declares the migration metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		events:      r.Counter("zfs_nomad_migrations_total", "Moves, failovers and stale primaries set aside, by result.", "kind", "result"),
		moveSeconds: r.Counter("zfs_nomad_move_seconds_total", "Time spent in successful planned moves."),
		rpo:         r.Gauge("zfs_nomad_failover_rpo_seconds", "Age of the snapshot a failover promoted: writes in this window on the lost primary are gone.", "volume_id"),
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
	}
}

func (m *Metrics) recordRPO(volumeID string, d time.Duration) {
	if m != nil {
		m.rpo.Set(d.Seconds(), volumeID)
	}
}
