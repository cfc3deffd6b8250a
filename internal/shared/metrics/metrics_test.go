package metrics

import (
	"strings"
	"testing"
)

func TestExposition(t *testing.T) {
	r := NewRegistry()
	sent := r.Counter("zfs_nomad_bytes_sent_total", "Bytes sent.", "peer")
	lag := r.Gauge("zfs_nomad_lag_seconds", "Lag.", "volume_id", "node")
	sent.Add(10, "n2")
	sent.Add(5, "n2")
	sent.Add(1, `we"ird`)
	lag.Set(3.5, "vol-1", "n2")
	lag.Set(1, "vol-2", "n3")
	lag.Delete("vol-2", "n3")
	var b strings.Builder
	r.WriteTo(&b)
	want := `# HELP zfs_nomad_bytes_sent_total Bytes sent.
# TYPE zfs_nomad_bytes_sent_total counter
zfs_nomad_bytes_sent_total{peer="n2"} 15
zfs_nomad_bytes_sent_total{peer="we\"ird"} 1
# HELP zfs_nomad_lag_seconds Lag.
# TYPE zfs_nomad_lag_seconds gauge
zfs_nomad_lag_seconds{volume_id="vol-1",node="n2"} 3.5
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
