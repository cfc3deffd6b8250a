package migration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// TestAnswerEnded: what the publish that finds a move job ended does,
// for each way a job ends and whether the source is published now (the
// table under the diagram in docs/migration.md, "A move job's states").
func TestAnswerEnded(t *testing.T) {
	full := errdefs.Wrap(errdefs.ErrResourceExhausted, "node n2's pool is full")
	broke := errdefs.Wrap(errdefs.ErrUnavailable, "the stream broke")
	tests := []struct {
		name            string
		outcome         moveOutcome
		err             error
		sourcePublished bool
		want            next
		wantErr         error // the kind of the answer's error
		wantFinalJob    bool  // a job in its final step was started
	}{
		{"moved", moved, nil, false, lookAgain, nil, false},
		{"moved, the source published again", moved, nil, true, lookAgain, nil, false},
		{"failed for good", failed, full, false, answer, errdefs.ErrResourceExhausted, false},
		{"failed for now", failed, broke, false, answer, errdefs.ErrFailedPrecondition, false},
		{"failed, the source published", failed, broke, true, answer, errdefs.ErrFailedPrecondition, false},
		{"caught up, the source still published", caughtUp, nil, true, goOn, nil, false},
		{"caught up, the source unpublished", caughtUp, nil, false, answer, errdefs.ErrFailedPrecondition, true},
		{"nothing to move, the source published", nothingToMove, nil, true, goOn, nil, false},
		{"nothing to move, the source unpublished", nothingToMove, nil, false, answer, errdefs.ErrFailedPrecondition, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fakes, n1, _ := threeNodes()
			id := n1.PutPrimary("vol", 1)
			// The final step a caught-up job starts waits here, so that the
			// publish answers with it running.
			release := make(chan struct{})
			defer close(release)
			_ = heldPushes(n1, release)
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			m.CatchUpWait = time.Millisecond
			t.Cleanup(m.Stop)
			nodes, _, err := fakes.Cluster(t).Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			source, target := nodes[0], nodes[1]
			p := copyOn{node: source, copy: agentclient.Copy{VolumeID: id, Generation: 1, Mounted: tc.sourcePublished}}
			c := newMoveJob(p, "n2", true, m.now())
			c.end(tc.outcome, tc.err, m.now())
			if err := m.jobs.add(c, 1); err != nil {
				t.Fatal(err)
			}

			a := m.newAttempt(id, "n2", false)
			n, err := m.answerEnded(context.Background(), a, c, p, target)
			if n != tc.want || (tc.wantErr == nil) != (err == nil) || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("answerEnded: %v, %v; want %v with an error of kind %v", n, err, tc.want, tc.wantErr)
			}
			job, running := m.jobs.runningTo(id, "n2")
			if running != tc.wantFinalJob {
				t.Fatalf("a job runs after the answer: %v, want %v", running, tc.wantFinalJob)
			}
			if running && (job == c || !job.inFinalStep() || a.running != job) {
				t.Errorf("the job started: a new one %v, in its final step %v, the one the refusal names %v", job != c, job.inFinalStep(), a.running == job)
			}
			if !running && job != nil {
				t.Errorf("the ended job is still kept after the publish answered from it")
			}
		})
	}
}

// TestJobSteps: a job goes from its catch-up to its final step and ends
// once; one whose target is fresh starts in its final step.
func TestJobSteps(t *testing.T) {
	p := copyOn{node: cluster.Node{Info: agentclient.NodeInfo{NodeID: "n1"}}, copy: agentclient.Copy{VolumeID: "vol", Generation: 3}}
	now := time.Unix(1_800_000_000, 0)
	c := newMoveJob(p, "n2", true, now)
	if c.inFinalStep() || c.isDone() {
		t.Fatalf("a new job with a catch-up: in its final step %v, done %v", c.inFinalStep(), c.isDone())
	}
	if o, _ := c.result(); o != notEnded {
		t.Fatalf("a running job's outcome: %v", o)
	}
	c.enterFinalStep()
	if !c.inFinalStep() {
		t.Fatal("enterFinalStep left the job catching up")
	}
	c.end(moved, nil, now.Add(time.Second))
	if o, err := c.result(); o != moved || err != nil || !c.isDone() {
		t.Fatalf("ended: %v, %v, done %v", o, err, c.isDone())
	}
	if fresh := newMoveJob(p, "n2", false, now); !fresh.inFinalStep() {
		t.Error("a job whose target is fresh does not start in its final step")
	}
}

// TestAForgottenJobTakesItsMetric: a job that ended caught up longer than
// catchUpKeep ago is forgotten at the next lookup of any job, whoever
// looks (a publish's hand-off, its arrival, a stage's awaited move), and
// its pending final step's metric with it.
func TestAForgottenJobTakesItsMetric(t *testing.T) {
	fakes, n1, _ := threeNodes()
	id := n1.PutPrimary("vol", 1)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	registry := metrics.NewRegistry()
	m.Metrics = NewMetrics(registry)
	now := time.Unix(1000, 0)
	m.SetClock(func() time.Time { return now })
	p := copyOn{copy: agentclient.Copy{VolumeID: id, Generation: 1}}
	j := newMoveJob(p, "n2", true, now)
	if err := m.jobs.add(j, DefaultMaxCatchUps); err != nil {
		t.Fatal(err)
	}
	m.Metrics.finalStepPending(j, true)
	j.end(caughtUp, nil, now)

	now = now.Add(catchUpKeep)
	if got := m.findJob(id, "n2"); got != j || !finalStepPending(t, registry, id, "n2") {
		t.Fatalf("catchUpKeep after its end: findJob = %p, pending %v; want the job (%p), still pending", got, finalStepPending(t, registry, id, "n2"), j)
	}
	now = now.Add(time.Second)
	if got := m.findJob(id, "n3"); got != nil {
		t.Errorf("a lookup of another target found %p", got)
	}
	if finalStepPending(t, registry, id, "n2") {
		t.Error("the forgotten job's final step still shows pending")
	}
	if got := m.findJob(id, "n2"); got != nil {
		t.Errorf("the forgotten job is still found: %p", got)
	}
}
