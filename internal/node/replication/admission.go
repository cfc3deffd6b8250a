package replication

// What a stream may do to this node's copy, decided before zfs receive
// changes anything: the checks on its header, against the copy as read
// (refused at once, without the copy's lock, when the header alone
// decides), and on its first record, and where it is received (prepare).
// docs/replication.md, "Protocol", step 4; docs/safety.md, "What a peer's
// header may decide".

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// refuseOnHeader refuses, before the stream's first record and without
// the copy's lock, what the header and the copy as read then (found)
// decide (refuseEarly), a generation too far above what this node
// promised (refuseUnknownGeneration), and a new replica beyond its
// sender's bound (refuseOneReplicaTooMany).
func (r *Receiver) refuseOnHeader(ctx context.Context, h Header, found copyRead) error {
	if err := refuseEarly(h, found); err != nil {
		return err
	}
	if err := r.refuseUnknownGeneration(ctx, h); err != nil {
		return err
	}
	return r.refuseOneReplicaTooMany(ctx, h, found)
}

// refuseEarly refuses, before the stream's first record and without the
// copy's lock, what the header and the copy read without the lock
// (found) decide alone: a stream into a copy that is not a replica, an
// incremental or resumed stream without a replica, or one that would
// lower the replica's generation. What it lets through is checked again
// under the lock (prepare); a copy it could not read is left to that
// check too.
func refuseEarly(h Header, found copyRead) error {
	if found.err != nil || found.replacing {
		return nil
	}
	state := found.state
	if state.Exists && state.Role != RoleReplica {
		return notAReplica(h, state)
	}
	if k := h.Kind; k == KindIncremental || k == KindResume {
		if !state.Exists {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition, "no replica of %s to receive an %s stream into", h.VolumeID, h.Kind)
		}
		if state.Generation > h.Generation {
			return lowerGeneration(h, state)
		}
	}
	return nil
}

// refuseUnknownGeneration refuses a stream whose generation is more than
// MaxGenerationLead above the generation this node's own promise record
// holds of the volume. The record is what this node granted as part of a
// majority (volume.Records.Reserve); a replica's generation label is not
// counted: a peer's earlier stream set it, and a bound measured from it
// would rise with every stream a liar sends, MaxGenerationLead at a time.
// The record only grows, so a stream let through here stays within the
// bound under the copy's lock.
func (r *Receiver) refuseUnknownGeneration(ctx context.Context, h Header) error {
	promised, err := r.promise(ctx, h.VolumeID)
	if err != nil {
		return err
	}
	if g := h.Generation; g > promised.Generation+MaxGenerationLead {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"the stream of volume %s claims generation %d, more than %d above the generation this node's promise record holds (%d): no majority can have promised it; refused. "+
				"If the volume really moved that often while this node was away, its next move or failover reserves its generation here too, and the pushes pass",
			h.VolumeID, g, uint64(MaxGenerationLead), promised.Generation)
	}
	return nil
}

// promise reads this node's promise record of volume id
// (volume.Records.Reserve): the highest generation it promised, and to
// which node; none for a volume it never promised anything of. Only
// the controller's reservations write it: no peer's stream can.
func (r *Receiver) promise(ctx context.Context, id string) (copyrecord.Promise, error) {
	record, err := r.z.Property(ctx, copyrecord.PromiseShard(r.root, id), copyrecord.PropPromisePrefix+id)
	if errors.Is(err, zfs.ErrNotFound) { // no record in this shard yet
		return copyrecord.Promise{}, nil
	}
	if err != nil {
		return copyrecord.Promise{}, fmt.Errorf("reading the promise record of volume %s: %w", id, err)
	}
	return copyrecord.ParsePromise(record), nil
}

func notAReplica(h Header, state ReplicaState) error {
	return errdefs.Wrap(errdefs.ErrFailedPrecondition, "this node holds volume %s as %q, not as a replica: refusing to overwrite it", h.VolumeID, state.Role)
}

func lowerGeneration(h Header, state ReplicaState) error {
	return errdefs.Wrap(errdefs.ErrFailedPrecondition, "the replica of %s here is of generation %d; a stream of generation %d would lower it: refused",
		h.VolumeID, state.Generation, h.Generation)
}

// readHeader reads and checks the stream's header: a volume ID, a
// snapshot name, a sender that is who its certificate says, a generation
// in bounds.
func (r *Receiver) readHeader(ctx context.Context, sender string, in Incoming, guard *stallGuard) (Header, error) {
	h, err := readHeader(ctx, r.root, sender, in, guard)
	if err != nil {
		return Header{}, err
	}
	if g := h.Generation; g == 0 || g > MaxGeneration {
		return Header{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "generation %d in the header of volume %s: must be 1 to %d", g, h.VolumeID, uint64(MaxGeneration))
	}
	return h, nil
}

// readHeader reads a stream's header and checks what every receiver
// does: a volume ID, its dataset under root, a snapshot name, a sender
// that is who its certificate says.
func readHeader(ctx context.Context, root, sender string, in Incoming, guard *stallGuard) (Header, error) {
	h, err := guard.header(ctx, in)
	if err != nil {
		return Header{}, fmt.Errorf("reading the header: %w", err)
	}
	fs, err := dataset(root, h.VolumeID)
	if err != nil {
		return Header{}, err
	}
	if err := zfs.ValidateName(fs + "@" + h.Snapshot); err != nil && h.Kind != KindResume {
		return Header{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "snapshot name %q: %v", h.Snapshot, err)
	}
	// A node's certificate names the node: a stream may not claim to come
	// from another (docs/security.md).
	if sender != "" && sender != h.SourceNodeID {
		return Header{}, errdefs.Wrap(errdefs.ErrPermissionDenied, "the stream of volume %s claims to come from node %q, but its sender's certificate names %q: each node needs a certificate of its own, with its node ID as the common name",
			h.VolumeID, h.SourceNodeID, sender)
	}
	return h, nil
}

// readBegin reads the stream's data messages until it holds the first
// record, within what the guard allows.
func readBegin(ctx context.Context, in Incoming, guard *stallGuard) ([]byte, error) {
	head := make([]byte, 0, readSize)
	for len(head) < beginRecordSize {
		n, err := guard.read(ctx, in, head[len(head):cap(head)])
		head = head[:len(head)+n]
		if err == io.EOF && len(head) < beginRecordSize {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "it ends after %d bytes, before its first record", len(head))
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	return head, nil
}

// readSize is the most a receive reads of its stream at once: the
// sender's chunk.
const readSize = chunkSize

// intoTarget is where a stream is received.
type intoTarget struct {
	target    string            // the replica, or for a replacement its incoming name
	props     map[string]string // set by zfs receive -o (a full stream only)
	replacing bool              // a full stream replacing an existing replica
}

// prepare checks that the stream fits this node's copy and says where it
// goes. A full stream for a volume of which this node holds an older
// generation's replica is received beside it, under the incoming name,
// and takes its place only once complete (replace).
func (r *Receiver) prepare(ctx context.Context, fs string, h Header, fromGUID uint64, found copyRead, log hclog.Logger) (intoTarget, error) {
	state := found.state
	if state.Exists && state.Role != RoleReplica {
		return intoTarget{}, notAReplica(h, state)
	}
	if state.ResumeToken != "" && h.Kind != KindResume {
		// The sender chose not to resume (it checks every token, and
		// refuses one whose snapshot it pruned): the partial receive is
		// of no use, and would make this receive fail.
		log.Warn("the sender sends afresh instead of resuming: discarding the partial receive")
		if err := r.z.AbortReceive(ctx, fs); err != nil {
			return intoTarget{}, fmt.Errorf("discarding the partial receive into %s: %w", fs, err)
		}
		// Discarding an interrupted first receive removes the copy.
		if found = r.readCopy(ctx, fs); found.err != nil {
			return intoTarget{}, found.err
		}
		state = found.state
	}
	switch h.Kind {
	case KindFull:
		props := map[string]string{"readonly": "on", "mountpoint": "legacy"}
		if state.Exists && len(found.snapshots) == 0 {
			// A copy without a snapshot holds nothing to keep.
			if err := r.replicas.DestroyReplica(ctx, fs); err != nil {
				return intoTarget{}, fmt.Errorf("removing the empty replica %s before a full receive: %w", fs, err)
			}
			state.Exists = false
		}
		if !state.Exists {
			maps.Copy(props, r.fullLabels(h))
			return intoTarget{target: fs, props: props}, nil
		}
		if state.Generation >= h.Generation {
			return intoTarget{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "a replica of %s exists but shares no snapshot with the source; an operator must remove it before a full send", h.VolumeID)
		}
		// A copy of an older generation, left behind by a move or a
		// failover. Unlabelled until complete, the incoming copy is
		// neither listed nor taken for a replica.
		log.Warn("receiving a replacement for a replica of an older generation that shares no snapshot with the new primary",
			"replica_generation", state.Generation, "primary_generation", h.Generation)
		incoming := incomingName(fs)
		if err := r.destroyIncoming(ctx, incoming); err != nil {
			return intoTarget{}, fmt.Errorf("removing an earlier, broken replacement %s: %w", incoming, err)
		}
		return intoTarget{target: incoming, props: props, replacing: true}, nil
	case KindIncremental, KindResume:
		if !state.Exists {
			return intoTarget{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "no replica of %s to receive an %s stream into", h.VolumeID, h.Kind)
		}
		if state.Generation > h.Generation {
			return intoTarget{}, lowerGeneration(h, state)
		}
		if h.Kind == KindIncremental {
			if err := r.rollBackTo(ctx, fs, found.snapshots, fromGUID, state.Generation, h, log); err != nil {
				return intoTarget{}, err
			}
		}
		return intoTarget{target: fs}, nil
	}
	return intoTarget{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "unknown stream kind %q", h.Kind)
}

// rollBackTo readies the replica at fs, of generation, for an
// incremental from its snapshot with GUID base. Nothing a peer sends
// rolls back a snapshot unless a majority-promised generation supersedes
// it, so the snapshots after the base go only when both hold:
//   - this node's own promise record holds a generation above the
//     replica's, promised to the sender (rollbackSuperseded): a majority,
//     this node among them, chose the sender for a generation after the
//     history those snapshots belong to, and a generation is promised to
//     one node only (I3), so no other peer's header can claim it;
//   - the sender's history vouches for the replica's generation (a
//     planned move ended it with a final snapshot the sender has): a
//     sender promoted by a failover says it does not.
//
// Otherwise they may hold writes the sender lacks, and the stream is
// refused before anything is changed: the sender sends from the replica's
// newest snapshot, or in full, and a full stream sets the replica aside
// (retire, I4).
func (r *Receiver) rollBackTo(ctx context.Context, fs string, snaps []zfs.Snap, base, generation uint64, h Header, log hclog.Logger) error {
	i := slices.IndexFunc(snaps, func(s zfs.Snap) bool { return s.GUID == base })
	if i < 0 {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "the replica of %s lacks the stream's base (guid %d): it was destroyed meanwhile; the next push picks another", h.VolumeID, base)
	}
	after := snaps[i+1:]
	if len(after) == 0 {
		return nil
	}
	newest := copyrecord.ShortSnapshotName(after[len(after)-1].Name)
	promised, err := r.promise(ctx, h.VolumeID)
	if err != nil {
		return err
	}
	if !rollbackSuperseded(promised, h.SourceNodeID, generation) {
		log.Warn("refused an incremental that would roll back snapshots no generation promised to its sender supersedes",
			"replica_generation", generation, "promised_generation", promised.Generation, "promised_holder", promised.Holder,
			"base", copyrecord.ShortSnapshotName(snaps[i].Name), "newest", newest, "generation", h.Generation, "history_from", h.HistoryFrom)
		record := "no promise of it"
		if promised.Generation > 0 {
			record = fmt.Sprintf("generation %d promised to %s", promised.Generation, promised.Holder)
		}
		remedy := "Send from the replica's newest snapshot (%[1]s); a sender that lacks it sends the volume in full, and this node sets the old replica aside"
		if generation == h.Generation {
			// No full stream replaces a replica of the sender's own
			// generation either (intoTarget).
			remedy = "Send from the replica's newest snapshot (%[1]s); a sender of the replica's own generation that lacks it cannot update this replica: " +
				"remove it (zfs-controller remove-replica -node %[2]s %[3]s) and the next push sends the volume in full, or the volume's next move replaces it"
		}
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"the replica of %s on node %s holds %d snapshot(s) after the stream's base, the newest %s, received at generation %d; this node's promise record holds %s, "+
				"so no generation promised to node %s supersedes them, and they may hold writes the sender lacks: refused, nothing changed. %s",
			h.VolumeID, r.nodeID, len(after), newest, generation, record, h.SourceNodeID, fmt.Sprintf(remedy, newest, r.nodeID, h.VolumeID))
	}
	vouched := h.HistoryFrom > 0 && h.HistoryFrom <= generation && generation < h.Generation
	if !vouched {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"the replica of %s holds %d snapshots after the stream's base, taken at generation %d, which the sender's history (generations %d to %d) does not hold: they may hold writes the sender lacks; refused",
			h.VolumeID, len(after), generation, h.HistoryFrom, h.Generation)
	}
	holds, err := r.z.Holds(ctx, fs)
	if err != nil {
		return fmt.Errorf("listing holds on %s: %w", fs, err)
	}
	names := make([]string, 0, len(after))
	for _, s := range after {
		for _, tag := range holds[s.Name] {
			if err := r.z.Release(ctx, s.Name, tag); err != nil && !errors.Is(err, zfs.ErrNotFound) {
				return fmt.Errorf("releasing %s on %s before rolling it back: %w", tag, s.Name, err)
			}
		}
		names = append(names, copyrecord.ShortSnapshotName(s.Name))
	}
	if err := r.z.Rollback(ctx, snaps[i].Name); err != nil {
		return fmt.Errorf("rolling the replica of %s back to %s: %w", h.VolumeID, snaps[i].Name, err)
	}
	log.Info("rolled back snapshots of an earlier generation that the sender's history holds and a generation promised to it supersedes", "replica_generation", generation,
		"history_from", h.HistoryFrom, "promised_generation", promised.Generation, "base", copyrecord.ShortSnapshotName(snaps[i].Name), "rolled_back", names)
	return nil
}

// rollbackSuperseded reports whether this node's promise record lets a
// stream from sender roll back snapshots of a replica of generation: the
// record promises sender a newer generation. The record is this node's
// own grant, part of the majority that promised it; a header is only the
// sender's word. A deletion's promise names no node, so nothing is
// rolled back while a volume is being deleted.
func rollbackSuperseded(promised copyrecord.Promise, sender string, generation uint64) bool {
	return sender != "" && promised.Holder == sender && promised.Generation > generation
}

// copyRead is what a receive reads of the copy before it decides.
type copyRead struct {
	state     ReplicaState
	snapshots []zfs.Snap // oldest first; none when the copy does not exist
	replacing bool       // an interrupted replacement waits beside it
	err       error
}

func (r *Receiver) readCopy(ctx context.Context, fs string) copyRead {
	var found copyRead
	// Unless it is surely absent, finishReplace looks at it and says.
	_, err := r.z.Property(ctx, incomingName(fs), copyrecord.PropRole)
	found.replacing = !errors.Is(err, zfs.ErrNotFound)
	if found.state, found.err = r.copyState(ctx, fs); found.err != nil || !found.state.Exists {
		return found
	}
	if found.snapshots, found.err = r.z.Snapshots(ctx, fs); found.err != nil {
		found.err = fmt.Errorf("listing the snapshots of %s: %w", fs, found.err)
	}
	return found
}
