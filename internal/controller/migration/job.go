package migration

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A move job is a volume's move to one target run in the background, in
// the memory of the controller instance whose publish started it (the
// hand-off in publish.go; runner.go runs it; docs/migration.md, "A move
// job's states"). It catches the target up, or runs the final step, or
// both, and ends; its step and its outcome change only through
// newMoveJob, enterFinalStep and end, under its mutex:
//
//	catching up ──► final step ──► ended: moved, nothing to move, or failed
//	     │
//	     └────────────────────────► ended: caught up (its source was still
//	                                published), or failed
//
// A job whose target is fresh starts in its final step. Steps never go
// back: a job granted ahead that tries again after a failure
// (Migrator.runMove) stays in the step it reached while it repeats its
// catch-up, which resumes what arrived.

// moveStep is the part of a move a job runs.
type moveStep int

const (
	// catchingUp: the source pushes the primary to the target, unfenced,
	// as a scheduled push would.
	catchingUp moveStep = iota
	// finalStep: reserve the next generation, fence the source and send
	// the last increment, promote the target, demote the source
	// (Migrator.finishMove).
	finalStep
)

// moveOutcome is how a job ended; notEnded while it runs.
type moveOutcome int

const (
	notEnded moveOutcome = iota
	// moved: the target holds the primary.
	moved
	// caughtUp: the target caught up while the source was published; the
	// final step waits for the CO's retry of the publish.
	caughtUp
	// nothingToMove: the final step found the source published again, or
	// no longer the primary.
	nothingToMove
	// failed: the job's err says why.
	failed
)

// moveJob is one background move of a volume's primary to a target.
type moveJob struct {
	volumeID, source, target string
	started                  time.Time
	// The source's copy when the move started: its generation, and
	// whether it was unpublished (only then may the publish be granted
	// ahead of the move's end: the final step follows the catch-up).
	sourceGeneration  uint64
	sourceUnpublished bool

	mu sync.Mutex
	// seen is the look of the publish that started the job at its final
	// step, taken just before: the final step's first attempt acts on it
	// instead of asking every node again (takeSeen).
	seen    *view
	step    moveStep
	outcome moveOutcome
	err     error     // failed: why
	ended   time.Time // zero while it runs
	done    chan struct{}
	// bytes and total are sent so far, and the estimate of all; since is
	// when the push that sent them started (its rate estimates the end),
	// and via, when that push is not this job's own, why the source says
	// it runs (follow).
	bytes, total   int64
	since          time.Time
	via            string
	publishedAhead time.Time // when a publish was granted ahead of its end
}

// newMoveJob is the job of moving p to target, from its catch-up, or
// from its final step when the target is fresh.
func newMoveJob(p copyOn, target string, withCatchUp bool, now time.Time) *moveJob {
	step := catchingUp
	if !withCatchUp {
		step = finalStep
	}
	return &moveJob{volumeID: p.copy.VolumeID, source: p.nodeID(), target: target, started: now, step: step, done: make(chan struct{}),
		sourceGeneration: p.copy.Generation, sourceUnpublished: !p.copy.Mounted}
}

// takeSeen returns the look the job was started with, once.
func (j *moveJob) takeSeen() *view {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := j.seen
	j.seen = nil
	return v
}

// enterFinalStep moves a running job on from its catch-up.
func (j *moveJob) enterFinalStep() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.step = finalStep
}

func (j *moveJob) inFinalStep() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.step == finalStep
}

// end ends the job with outcome (err for failed) at at.
func (j *moveJob) end(outcome moveOutcome, err error, at time.Time) {
	j.mu.Lock()
	j.outcome, j.err, j.ended = outcome, err, at
	j.mu.Unlock()
	close(j.done)
}

// result is how the job ended (notEnded while it runs).
func (j *moveJob) result() (moveOutcome, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.outcome, j.err
}

// movedAwaySince tells whether j ended having moved the volume to its
// target, and p, a primary elsewhere, is newer than j's source was: the
// volume moved on from the target since. A p of j's source generation
// is a look taken before j's promotion, which a look again resolves.
func (j *moveJob) movedAwaySince(p copyOn) bool {
	outcome, _ := j.result()
	return outcome == moved && p.copy.Generation > j.sourceGeneration
}

// isDone tells whether j ended.
func (j *moveJob) isDone() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// progress records what the job's own push, started at since, sent.
func (j *moveJob) progress(p agentclient.Progress, since time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.bytes, j.total, j.since, j.via = p.Bytes, p.TotalBytes, since, ""
}

// observe records what the source's running push t of the volume to the
// move's target sent, as the move's progress; it reports whether t is
// another push than the one observed last, or sent more since.
func (j *moveJob) observe(t agentclient.Transfer) (progressed bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	since, via := time.Unix(t.StartedUnix, 0), cmp.Or(t.Purpose, "a push")
	progressed = j.via != via || !j.since.Equal(since) || t.Bytes > j.bytes
	j.bytes, j.total, j.since, j.via = t.Bytes, t.TotalBytes, since, via
	return progressed
}

// refusal is the publish's answer while j runs: retryable
// (FailedPrecondition, which Nomad retries), saying how far it is.
func (j *moveJob) refusal(now time.Time) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	elapsed := now.Sub(j.started)
	if j.step == finalStep {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"moving volume %s to node %s: the final step (fence, last increment, promotion) runs in the background (%s sent before it, running %s); the move is done at a retry",
			j.volumeID, j.target, contract.Bytes(j.bytes), elapsed.Round(time.Second))
	}
	how := fmt.Sprintf("%s sent so far", contract.Bytes(j.bytes))
	if j.total > 0 {
		how = fmt.Sprintf("%s of %s", contract.Bytes(j.bytes), contract.Bytes(j.total))
		if left, ok := j.leftLocked(now); ok {
			how += fmt.Sprintf(", about %s left", left.Round(time.Second))
		}
	}
	if j.via != "" {
		how += fmt.Sprintf(", by the push already running there: %s", j.via)
	}
	return errdefs.Wrap(errdefs.ErrFailedPrecondition,
		"moving volume %s to node %s: node %s is sending it in the background (%s, running %s); the move finishes at a retry once that is done",
		j.volumeID, j.target, j.source, how, elapsed.Round(time.Second))
}

// leftLocked estimates the catch-up's time left from its rate so far,
// once it has run long enough for a rate to mean something.
func (j *moveJob) leftLocked(now time.Time) (time.Duration, bool) {
	elapsed := now.Sub(cmp.Or(j.since, j.started))
	if j.bytes <= 0 || j.total <= j.bytes || elapsed < minEstimateTime {
		return 0, false
	}
	return time.Duration(float64(elapsed) * float64(j.total-j.bytes) / float64(j.bytes)), true
}

// minEstimateTime is how long a catch-up runs before its rate gives an
// estimate of its end.
const minEstimateTime = 2 * time.Second

// wasGrantedAhead tells whether a publish was granted ahead of j's end.
func (j *moveJob) wasGrantedAhead() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.publishedAhead.IsZero()
}

// grantedAhead records that a publish was granted ahead of j's end.
func (j *moveJob) grantedAhead(at time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.publishedAhead.IsZero() {
		j.publishedAhead = at
	}
}

// aheadOf returns the generation the target's copy must exceed when the
// publish may be granted ahead of j's end: it runs its final step (which
// it does only with the source unpublished), or its source was
// unpublished when it started (the final step follows) and its catch-up
// is estimated to end within d.
func (j *moveJob) aheadOf(now time.Time, d time.Duration) (uint64, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.sourceGeneration == 0 {
		return 0, false
	}
	if j.step == finalStep {
		return j.sourceGeneration, true
	}
	left, ok := j.leftLocked(now)
	return j.sourceGeneration, j.sourceUnpublished && ok && left <= d
}

// moveJobs are the running jobs and the ended ones a publish has not
// yet answered from, by volume and target.
type moveJobs struct {
	mu  sync.Mutex
	all map[string]*moveJob
}

func jobKey(volumeID, target string) string { return volumeID + " " + target }

// find returns the job of volumeID to target, unless there is none or it
// ended more than catchUpKeep before now; those it forgets.
func (js *moveJobs) find(volumeID, target string, now time.Time) (j *moveJob, forgotten []*moveJob) {
	js.mu.Lock()
	defer js.mu.Unlock()
	for key, other := range js.all {
		other.mu.Lock()
		stale := !other.ended.IsZero() && now.Sub(other.ended) > catchUpKeep
		other.mu.Unlock()
		if stale {
			delete(js.all, key)
			forgotten = append(forgotten, other)
		}
	}
	return js.all[jobKey(volumeID, target)], forgotten
}

// add records j unless a move of j's volume to another node runs, or j
// starts with a catch-up and max catch-ups from j's source run already
// (jobs in their final step are not counted).
func (js *moveJobs) add(j *moveJob, max int) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	catchingUp := 0
	for _, other := range js.all {
		busy := !other.isDone()
		if busy && other.volumeID == j.volumeID {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition,
				"volume %s is moving to node %s in the background; it can move to node %s at a retry once that move is done", j.volumeID, other.target, j.target)
		}
		if busy && other.source == j.source && !other.inFinalStep() {
			catchingUp++
		}
	}
	if !j.inFinalStep() && catchingUp >= max {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"moving volume %s to node %s: node %s already sends %d volumes in the background (at most %d at once); this move starts at a retry once one is done",
			j.volumeID, j.target, j.source, catchingUp, max)
	}
	if js.all == nil {
		js.all = map[string]*moveJob{}
	}
	js.all[jobKey(j.volumeID, j.target)] = j
	return nil
}

// runningTo returns the job of volumeID to target while it runs.
func (js *moveJobs) runningTo(volumeID, target string) (*moveJob, bool) {
	js.mu.Lock()
	j := js.all[jobKey(volumeID, target)]
	js.mu.Unlock()
	return j, j != nil && !j.isDone()
}

// movingElsewhere answers, when a move of volumeID to a node other than
// nodeID runs in the background (its catch-up or its final step), the
// refusal of a publish to nodeID (nil otherwise): FailedPrecondition,
// which Nomad retries. Such a publish, to the move's source above all,
// must not act on the copies while the move may fence the source and
// promote its target: it is decided once the move ends.
func (js *moveJobs) movingElsewhere(volumeID, nodeID string) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	for _, j := range js.all {
		if j.volumeID != volumeID || j.target == nodeID || j.isDone() {
			continue
		}
		step := "catching its target up"
		if j.inFinalStep() {
			step = "final step running"
		}
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"volume %s is moving from node %s to node %s (%s); retry: the publish on node %s will be decided once the move ends",
			volumeID, j.source, j.target, step, nodeID)
	}
	return nil
}

// running returns the target of the move of volumeID running in the
// background, if one runs.
func (js *moveJobs) running(volumeID string) (string, bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	for _, j := range js.all {
		if j.volumeID == volumeID && !j.isDone() {
			return j.target, true
		}
	}
	return "", false
}

// remove forgets j (a publish answered from its end).
func (js *moveJobs) remove(j *moveJob) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.all[jobKey(j.volumeID, j.target)] == j {
		delete(js.all, jobKey(j.volumeID, j.target))
	}
}

// catchUpKeep is how long a finished catch-up waits for the publish that
// finishes its move; one older is forgotten (the CO gave up, or went
// elsewhere).
const catchUpKeep = 10 * time.Minute

// findJob returns the move job of volume id to nodeID, if there is one,
// and forgets the jobs that ended more than catchUpKeep ago (the CO gave
// up on them, or went elsewhere) with their pending final step's metric:
// every lookup forgets the same way, so no forgotten job's metric stays.
func (m *Migrator) findJob(id, nodeID string) *moveJob {
	j, forgotten := m.jobs.find(id, nodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false)
	}
	return j
}

// forgetJob forgets the ended job j, which a publish answered from, with
// its pending final step's metric.
func (m *Migrator) forgetJob(j *moveJob) {
	m.jobs.remove(j)
	m.Metrics.finalStepPending(j, false)
}
