package replication

import (
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// Metrics are a node's (or a backup target's) replication metrics. A
// nil *Metrics records nothing. Their series are bounded by the peers
// and targets, never by the volumes: a volume's own lag is the
// controller's (zfs_nomad_replica_lag_seconds), which withdraws it with
// the volume.
type Metrics struct {
	sent, received, lastSuccess metrics.Vec
	seconds, bytes, rate        metrics.HistogramVec
	// backupsOnly labels every transfer kind "backup": a target's
	// receipts are all backups.
	backupsOnly bool
}

// The kinds of transfer the metrics tell apart: the stream kinds
// (KindFull, KindIncremental, KindResume) between peers, and every
// stream to or at a backup target.
const kindBackup = "backup"

// Buckets of a transfer's duration (a final step's increment takes a
// second, a full stream of a large volume hours), size and rate.
var (
	transferSecondsBuckets = []float64{0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400}
	transferBytesBuckets   = []float64{1 << 16, 1 << 20, 16 << 20, 256 << 20, 1 << 30, 16 << 30, 256 << 30, 1 << 40}
	transferRateBuckets    = []float64{1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20, 256 << 20, 512 << 20, 1 << 30}
)

// NewMetrics declares the node's replication metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		sent:     r.Counter("zfs_nomad_replication_sent_bytes_total", "Bytes of zfs send streams sent to peers and backup targets.", "peer_node"),
		received: r.Counter("zfs_nomad_replication_received_bytes_total", "Bytes of streams received.", "source_node"),
		seconds: r.Histogram("zfs_nomad_replication_transfer_seconds", "How long each stream took, by direction (out, in), kind (full, incremental, resume, backup) and result (success, failure); _count is the transfers.",
			transferSecondsBuckets, "direction", "kind", "result"),
		bytes: r.Histogram("zfs_nomad_replication_transfer_bytes", "Bytes of each successful stream, by direction and kind.",
			transferBytesBuckets, "direction", "kind"),
		rate: r.Histogram("zfs_nomad_replication_transfer_rate_bytes_per_second", "Each successful stream's bytes over its duration, by direction and kind (streams under a second left out: their rate is mostly latency).",
			transferRateBuckets, "direction", "kind"),
		lastSuccess: r.Gauge("zfs_nomad_replication_last_success_timestamp_seconds", "When a transfer with a peer or backup target last completed, by direction.", "peer_node", "direction"),
	}
}

// ForTarget returns the metrics of a backup target's receipts: the same
// families, every kind "backup".
func ForTarget(m *Metrics) *Metrics {
	if m == nil {
		return nil
	}
	t := *m
	t.backupsOnly = true
	return &t
}

// transfer records one finished stream with peer, of the given stream
// kind; a push to a backup target (peer backupKey) counts as a backup.
func (m *Metrics) transfer(direction, kind, peer string, bytes int64, took time.Duration, err error) {
	if m == nil {
		return
	}
	if m.backupsOnly || strings.HasPrefix(peer, backupKeyPrefix) {
		kind = kindBackup
	}
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.seconds.Observe(took.Seconds(), direction, kind, result)
	if direction == "out" {
		m.sent.Add(float64(bytes), peer)
	} else {
		m.received.Add(float64(bytes), peer)
	}
	if err != nil {
		return
	}
	m.bytes.Observe(float64(bytes), direction, kind)
	if took >= time.Second {
		m.rate.Observe(float64(bytes)/took.Seconds(), direction, kind)
	}
	m.lastSuccess.Set(float64(time.Now().Unix()), peer, direction)
}
