// Package backupsched is the controller's backup schedule
// (docs/backups.md): every volume whose backup_to names backup targets is
// backed up to each of them once its newest backup there is backup_every
// old, by its node's push (the data goes node to target). It keeps no
// state: a round asks each target named for its backups' ages and the
// nodes for their primaries, so a restarted controller, or another
// instance taking the work lease, goes on where the last stopped, and a
// backup pushed by hand counts as the schedule's.
package backupsched

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Lister lists a backup target's backups (agentclient.Targets).
type Lister interface {
	Backups(ctx context.Context, target, volumeID string) ([]agentclient.Backup, error)
}

// Schedule runs backup rounds.
type Schedule struct {
	// Metrics records the backups' ages and results (nil: none).
	Metrics *Metrics
	// StallTimeout cancels a backup that moved no byte for that long
	// (default cluster.DefaultStallTimeout): it holds its volume's push
	// slot, which the replication schedule and moves need.
	StallTimeout time.Duration

	cl      *cluster.Cluster
	targets Lister
	log     hclog.Logger
	now     func() time.Time
	slots   chan struct{} // one per backup allowed to run at once
	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[due]bool // backups under way, not started again
}

// New returns a schedule over the cluster's nodes and targets that runs
// at most parallel backups at once.
func New(cl *cluster.Cluster, targets Lister, parallel int, log hclog.Logger) *Schedule {
	return &Schedule{cl: cl, targets: targets, log: log, now: time.Now, StallTimeout: cluster.DefaultStallTimeout,
		slots: make(chan struct{}, max(1, parallel)), running: map[due]bool{}}
}

// SetClock sets the clock backups' ages are judged by.
func (s *Schedule) SetClock(now func() time.Time) { s.now = now }

// Due is one backup a round decided on: volume VolumeID to Target, from
// its primary's node Source.
type Due struct {
	VolumeID, Name, Target string
	Source                 cluster.Node
	// Last is when the target received the volume's newest backup; zero
	// when it holds none.
	Last time.Time
}

// due is a Due's identity among the running backups.
type due struct{ volumeID, target string }

// Round plans one round and starts its backups in the background, and
// returns those it started. A backup still running from an earlier round
// is not started again; Wait waits for the backups started so far.
func (s *Schedule) Round(ctx context.Context) []Due {
	plan, err := s.Plan(ctx)
	if err != nil {
		s.log.Warn("backup round skipped", "error", err)
		return nil
	}
	var started []Due
	for _, d := range plan {
		if !s.claim(d) {
			continue
		}
		started = append(started, d)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.unclaim(d)
			select {
			case s.slots <- struct{}{}:
				defer func() { <-s.slots }()
			case <-ctx.Done():
				return
			}
			s.backup(ctx, d)
		}()
	}
	return started
}

// Wait waits until the backups started by earlier rounds have ended.
func (s *Schedule) Wait() { s.wg.Wait() }

// Plan decides which volumes are due for a backup to which target: those
// whose target holds no backup of them yet, or whose newest there is at
// least backup_every old. A volume with two primaries (a move between
// promotion and demotion) waits for the next round; a target that does
// not answer postpones its volumes' backups to the next round too.
func (s *Schedule) Plan(ctx context.Context) ([]Due, error) {
	nodes, unreachable, err := s.cl.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	healthy := cluster.Healthy(nodes)
	complete := cluster.AllAnswered(nodes, len(unreachable)) && len(healthy) == len(nodes)
	s.Metrics.beginRound()
	defer func() { s.Metrics.endRound(s.now(), complete) }()
	primaries := map[string][]cluster.Located[agentclient.Volume]{}
	for _, a := range cluster.Holdings(ctx, s.cl, healthy) {
		if a.Err != nil {
			complete = false
			s.log.Warn("node skipped this backup round", "node_id", a.Node.Info.NodeID, "error", a.Err)
			continue
		}
		for _, v := range a.Object.Volumes {
			primaries[v.VolumeID] = append(primaries[v.VolumeID], cluster.Located[agentclient.Volume]{Node: a.Node, Object: v})
		}
	}
	newest := map[string]map[string]time.Time{} // by target, then volume ID; nil: the target did not answer
	var out []Due
	for _, id := range slices.Sorted(maps.Keys(primaries)) {
		copies := primaries[id]
		v := copies[0]
		targets, every := contract.BackupPolicy(v.Object.Parameters)
		for _, t := range targets {
			ages, asked := newest[t]
			if !asked {
				ages = s.ages(ctx, t)
				newest[t] = ages
			}
			last := ages[id]
			s.Metrics.observe(id, t, every, last, ages != nil)
			if ages == nil || len(copies) != 1 {
				continue
			}
			if !last.IsZero() && s.now().Sub(last) < every {
				continue
			}
			out = append(out, Due{VolumeID: id, Name: v.Object.Name, Target: t, Source: v.Node, Last: last})
		}
	}
	return out, nil
}

// ages are, by volume ID, when target received each volume's newest
// backup; nil when the target did not answer.
func (s *Schedule) ages(ctx context.Context, target string) map[string]time.Time {
	all, err := s.targets.Backups(ctx, target, "")
	if err != nil {
		s.log.Warn("backup target did not answer: its volumes' backups wait for the next round", "backup_target", target, "error", err)
		return nil
	}
	return agentclient.NewestByVolume(all)
}

// backup has the volume's node push it to the target.
func (s *Schedule) backup(ctx context.Context, d Due) {
	log := s.log.With("volume_id", d.VolumeID, "volume_name", d.Name, "backup_target", d.Target, "source_node", d.Source.Info.NodeID)
	last, err := cluster.Push(ctx, d.Source, d.VolumeID, agentclient.Target{Backup: d.Target}, "backup schedule", s.StallTimeout, nil)
	switch {
	case errors.Is(err, errdefs.ErrAborted):
		s.Metrics.backupRan("busy")
		log.Debug("volume busy (a push or move of it runs): its backup waits for the next round", "error", err)
	case err != nil:
		s.Metrics.backupRan("failed")
		log.Warn("scheduled backup failed; the next round tries again", "error", err)
	default:
		s.Metrics.backupRan("done")
		log.Info("scheduled backup done", "kind", last.Kind, "snapshot", last.Snapshot, "bytes", last.Bytes)
	}
}

func (s *Schedule) claim(d Due) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := due{d.VolumeID, d.Target}
	if s.running[k] {
		return false
	}
	s.running[k] = true
	return true
}

func (s *Schedule) unclaim(d Due) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, due{d.VolumeID, d.Target})
}
