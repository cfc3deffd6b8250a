package backupsched

import (
	"math"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// Metrics are the backup schedule's metrics: the age of each volume's
// newest backup on each target its backup_to names, and the scheduled
// backups by result. A nil *Metrics records nothing.
//
// The age is what an operator alerts on, so it must not vanish when
// backups are late for the reasons that make them late: a target that
// does not answer keeps its volumes' ages growing from the newest backup
// it last listed, and a volume the round did not find (its node did not
// answer, or it was moving) keeps its series; a series goes only when
// every node answered and none holds the volume with that target in its
// backup_to (deleted, or no longer backed up there).
type Metrics struct {
	age, interval, backups metrics.Vec

	mu     sync.Mutex
	newest map[due]time.Time     // by volume and target: the newest backup seen (zero: none)
	every  map[due]time.Duration // by volume and target: the volume's backup_every
	seen   map[due]bool          // this round's
}

// NewMetrics declares the schedule's metrics in r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		age: r.Gauge("zfs_nomad_backup_age_seconds",
			"Age of each volume's newest backup on each backup target its backup_to names, as of the last backup round; +Inf when the target holds none.", "volume_id", "target"),
		interval: r.Gauge("zfs_nomad_backup_interval_seconds",
			"Each volume's backup_every, beside its backup age on each target its backup_to names: a backup older than twice this is late.", "volume_id", "target"),
		backups: r.Counter("zfs_nomad_scheduled_backups_total", "Backups the backup schedule ran, by result (done, failed, busy).", "result"),
		newest:  map[due]time.Time{},
		every:   map[due]time.Duration{},
	}
}

// beginRound starts a round's observations.
func (m *Metrics) beginRound() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = map[due]bool{}
}

// observe records the newest backup of volumeID on target (zero: none)
// and the volume's backup_every; answered is false when the target did
// not answer, and the newest it last listed stands.
func (m *Metrics) observe(volumeID, target string, every time.Duration, newest time.Time, answered bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := due{volumeID, target}
	m.seen[k] = true
	m.every[k] = every
	if answered || m.newest[k].Before(newest) {
		m.newest[k] = newest
	} else if _, known := m.newest[k]; !known {
		m.newest[k] = time.Time{}
	}
}

// endRound sets every series' age as of now; complete says every node
// answered the round, so a volume it did not see is gone from the
// schedule, and its series with it.
func (m *Metrics) endRound(now time.Time, complete bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, newest := range m.newest {
		if complete && !m.seen[k] {
			delete(m.newest, k)
			delete(m.every, k)
			m.age.Delete(k.volumeID, k.target)
			m.interval.Delete(k.volumeID, k.target)
			continue
		}
		m.interval.Set(m.every[k].Seconds(), k.volumeID, k.target)
		age := math.Inf(1)
		if !newest.IsZero() {
			age = now.Sub(newest).Seconds()
		}
		m.age.Set(age, k.volumeID, k.target)
	}
}

// Clear withdraws the age series, which only the work lease's holder
// keeps current: an instance that stops holding it must not leave its
// last values behind for an alert to read. The next holding's first
// round sets them afresh.
func (m *Metrics) Clear() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.age.Reset()
	m.interval.Reset()
	m.newest = map[due]time.Time{}
	m.every = map[due]time.Duration{}
}

func (m *Metrics) backupRan(result string) {
	if m != nil {
		m.backups.Add(1, result)
	}
}
