package scheduler

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// Metrics are the controller's replication metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	lag, interval, missing, pushes, surplus metrics.Vec
}

// NewMetrics declares the schedule's metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		lag:      r.Gauge("zfs_nomad_replica_lag_seconds", "Age of each replica's newest snapshot: what a failover to it would lose.", "volume_id", "node"),
		interval: r.Gauge("zfs_nomad_replication_interval_seconds", "Each replicated volume's replication_interval: the replica lag it asks for.", "volume_id"),
		missing:  r.Gauge("zfs_nomad_replicas_missing", "Replicas a volume asks for but does not have (complete) yet.", "volume_id"),
		pushes:   r.Counter("zfs_nomad_scheduled_pushes_total", "Pushes the schedule ran, by result.", "result"),
		surplus:  r.Counter("zfs_nomad_surplus_copies_total", "Copies a move demoted that the schedule found surplus: removed, or kept because their node refused.", "result"),
	}
}

func (m *Metrics) surplusCopy(result string) {
	if m != nil {
		m.surplus.Add(1, result)
	}
}

// Clear withdraws the per-volume gauges, which only the work lease's
// holder keeps current: an instance that stops holding it must not leave
// its last values behind for an alert to read.
func (m *Metrics) Clear() { m.reset() }

func (m *Metrics) reset() {
	if m != nil {
		m.lag.Reset()
		m.interval.Reset()
		m.missing.Reset()
	}
}

func (m *Metrics) observe(volumeID string, want int, interval time.Duration, have []replica, now time.Time) {
	if m == nil {
		return
	}
	m.interval.Set(interval.Seconds(), volumeID)
	complete := 0
	for _, r := range have {
		if r.last.Unix() > 0 {
			complete++
			m.lag.Set(now.Sub(r.last).Seconds(), volumeID, r.node.Info.NodeID)
		}
	}
	m.missing.Set(float64(max(0, want-complete)), volumeID)
}

func (m *Metrics) push(result string) {
	if m != nil {
		m.pushes.Add(1, result)
	}
}
