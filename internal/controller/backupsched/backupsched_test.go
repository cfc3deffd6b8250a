package backupsched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// lister answers each target's backups, or its error.
type lister struct {
	backups map[string][]agentclient.Backup
	down    map[string]bool
}

func (l lister) Backups(_ context.Context, target, _ string) ([]agentclient.Backup, error) {
	if l.down[target] {
		return nil, errors.New("connection refused")
	}
	return l.backups[target], nil
}

// TestPlan: a volume is due for a backup to each target its backup_to
// names once the target's newest backup of it is backup_every old (24 h
// when unnamed), or when it holds none; nothing else is; a volume with
// two primaries waits, and so do the volumes of a target that does not
// answer.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var fakes clustertest.Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1", AvailableBytes: 1 << 30})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2", AvailableBytes: 1 << 30})
	put := func(n *clustertest.FakeAgent, name string, params map[string]string) string {
		id := contract.VolumeIDForName(name)
		n.PutCopy(agentclient.Copy{VolumeID: id, Name: name, Role: contract.RolePrimary, Generation: 1, CapacityBytes: 1 << 30, Parameters: params})
		return id
	}
	hourly := map[string]string{contract.ParamBackupTo: "vault", contract.ParamBackupEvery: "1h"}
	web := put(n1, "web", hourly)
	db := put(n1, "db", map[string]string{contract.ParamBackupTo: "vault"})
	put(n2, "fresh", map[string]string{contract.ParamBackupTo: "vault, offsite"})
	put(n2, "tmp", nil)
	moving := put(n1, "moving", hourly)
	put(n2, "moving", hourly)
	backups := map[string][]agentclient.Backup{"vault": {
		{VolumeID: web, Received: now.Add(-3 * time.Hour)},
		{VolumeID: web, Received: now.Add(-61 * time.Minute)},
		{VolumeID: db, Received: now.Add(-23 * time.Hour)},
		{VolumeID: moving, Received: now.Add(-2 * time.Hour)},
	}}
	s := New(fakes.Cluster(t), lister{backups: backups, down: map[string]bool{"offsite": true}}, 2, hclog.NewNullLogger())
	s.SetClock(func() time.Time { return now })
	plan, err := s.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range plan {
		got = append(got, d.Name+"->"+d.Target+"@"+d.Source.Info.NodeID)
	}
	slices.Sort(got)
	if want := []string{"fresh->vault@n2", "web->vault@n1"}; !slices.Equal(got, want) {
		t.Errorf("due: %v, want %v", got, want)
	}

	// A round has each due volume's node push it to its target, by name.
	s.Round(context.Background())
	s.Wait()
	if to := n1.PushedTo(); len(to) != 1 || to[0] != (agentclient.Target{Backup: "vault"}) {
		t.Errorf("n1 was asked to push to %+v, want web's backup to vault", to)
	}
	if to := n2.PushedTo(); len(to) != 1 || to[0] != (agentclient.Target{Backup: "vault"}) {
		t.Errorf("n2 was asked to push to %+v, want fresh's backup to vault", to)
	}
}

// TestBackupAges: each volume's newest backup on each target its
// backup_to names has its age as a series (+Inf when there is none); a
// target that stops answering keeps its volumes' ages growing, and so
// does a volume whose node does not answer; a volume every node answers
// it no longer holds loses its series, and every series goes when the
// instance stops holding the work lease (Clear).
func TestBackupAges(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var fakes clustertest.Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1", AvailableBytes: 1 << 30})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2", AvailableBytes: 1 << 30})
	web, db := contract.VolumeIDForName("web"), contract.VolumeIDForName("db")
	n1.PutCopy(agentclient.Copy{VolumeID: web, Name: "web", Role: contract.RolePrimary, Generation: 1, Parameters: map[string]string{contract.ParamBackupTo: "vault,offsite"}})
	n2.PutCopy(agentclient.Copy{VolumeID: db, Name: "db", Role: contract.RolePrimary, Generation: 1, Parameters: map[string]string{contract.ParamBackupTo: "vault"}})
	l := lister{backups: map[string][]agentclient.Backup{"vault": {{VolumeID: web, Received: now.Add(-time.Hour)}, {VolumeID: db, Received: now.Add(-2 * time.Hour)}}},
		down: map[string]bool{}}
	registry := metrics.NewRegistry()
	s := New(fakes.Cluster(t), l, 2, hclog.NewNullLogger())
	s.Metrics = NewMetrics(registry)
	clock := now
	s.SetClock(func() time.Time { return clock })
	round := func() string {
		t.Helper()
		if _, err := s.Plan(context.Background()); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		if _, err := registry.WriteTo(&out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	series := func(volumeID, target, value string) string {
		return `zfs_nomad_backup_age_seconds{target="` + target + `",volume_id="` + volumeID + `"} ` + value + "\n"
	}
	// wantSeries checks the age series, and that each has its volume's
	// backup_every beside it (the default day), and no other.
	wantSeries := func(got string, want ...string) {
		t.Helper()
		var ages, intervals, wantIntervals []string
		for _, line := range strings.SplitAfter(got, "\n") {
			switch {
			case strings.HasPrefix(line, "zfs_nomad_backup_age_seconds{"):
				ages = append(ages, line)
			case strings.HasPrefix(line, "zfs_nomad_backup_interval_seconds{"):
				intervals = append(intervals, line)
			}
		}
		slices.Sort(want)
		if !slices.Equal(ages, want) {
			t.Errorf("age series:\n%s\nwant\n%s", strings.Join(ages, ""), strings.Join(want, ""))
		}
		for _, w := range want {
			labels := w[strings.Index(w, "{") : strings.Index(w, "}")+1]
			wantIntervals = append(wantIntervals, "zfs_nomad_backup_interval_seconds"+labels+" 86400\n")
		}
		if !slices.Equal(intervals, wantIntervals) {
			t.Errorf("interval series:\n%s\nwant\n%s", strings.Join(intervals, ""), strings.Join(wantIntervals, ""))
		}
	}
	wantSeries(round(), series(web, "vault", "3600"), series(web, "offsite", "+Inf"), series(db, "vault", "7200"))

	// vault stops answering, and n2 too: the ages go on growing.
	l.down["vault"] = true
	n2.SetDown(true)
	clock = now.Add(time.Hour)
	wantSeries(round(), series(web, "vault", "7200"), series(web, "offsite", "+Inf"), series(db, "vault", "10800"))

	// Every node answers, and none holds db: its series goes.
	n2.SetDown(false)
	if err := n2.DeleteVolume(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	wantSeries(round(), series(web, "vault", "7200"), series(web, "offsite", "+Inf"))

	// The instance stops holding the work lease: its series go.
	s.Metrics.Clear()
	var out strings.Builder
	if _, err := registry.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	wantSeries(out.String())
}
