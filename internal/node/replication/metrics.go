package replication

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// Metrics are a node's replication metrics. A nil *Metrics records nothing.
type Metrics struct {
	sent, received, transfers, seconds, lastSuccess metrics.Vec
}

// NewMetrics declares the node's replication metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		sent:        r.Counter("zfs_nomad_replication_sent_bytes_total", "Bytes of zfs send streams sent to peers.", "peer_node"),
		received:    r.Counter("zfs_nomad_replication_received_bytes_total", "Bytes of streams received from peers.", "source_node"),
		transfers:   r.Counter("zfs_nomad_replication_transfers_total", "Transfers by direction (out, in), kind (full, incremental, resume) and result (success, failure).", "direction", "kind", "result"),
		seconds:     r.Counter("zfs_nomad_replication_transfer_seconds_total", "Time spent in transfers, by direction and result; with transfers_total it gives mean durations.", "direction", "result"),
		lastSuccess: r.Gauge("zfs_nomad_replication_last_success_timestamp_seconds", "When a transfer of a volume last completed, by peer and direction.", "volume_id", "peer_node", "direction"),
	}
}

// transfer records one finished transfer.
func (m *Metrics) transfer(direction, kind, volumeID, peer string, bytes int64, took time.Duration, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.transfers.Add(1, direction, kind, result)
	m.seconds.Add(took.Seconds(), direction, result)
	if direction == "out" {
		m.sent.Add(float64(bytes), peer)
	} else {
		m.received.Add(float64(bytes), peer)
	}
	if err == nil {
		m.lastSuccess.Set(float64(time.Now().Unix()), volumeID, peer, direction)
	}
}
