// Package replication streams volumes between node agents with zfs send
// and zfs receive (docs/replication.md):
//
//	source node                                    target node
//	Pusher.Push ── ReplicaState ─────────────────► Receiver.ReplicaState
//	  zfs send ─► chunkWriter ── Receive stream ──► pipe ─► zfs receive -s -u
//	  hold new base, release old  ◄── snapshot GUID ── hold new base, release old
//
// The target builds every dataset name from its own root and a validated
// volume ID; nothing a peer sends names a dataset. The package speaks plain
// types (messages.go): the node's gRPC adapter, package agent, carries
// ReplicaState and the Receive stream between the nodes.
//
// The driver's words (generation, promise, fence, lease, set aside,
// tombstone, ...) are defined in docs/glossary.md.
package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

const (
	// SnapshotPrefix starts the short name of every replication snapshot.
	SnapshotPrefix = contract.ReplicationSnapshotPrefix
	// BaseHoldTag holds the newest snapshot both sides share: the
	// incremental base, never destroyed while it is the base. A receiver
	// holds its newest received snapshot with it; a sender holds the base of
	// each peer with BaseHoldTag + "-" + the peer's node ID.
	BaseHoldTag = copyrecord.BaseHoldTag
	// RoleReplica labels a received copy.
	RoleReplica = contract.RoleReplica

	// Transfer kinds, as reported in progress and headers.
	KindFull        = "full"
	KindIncremental = "incremental"
	KindResume      = "resume"

	chunkSize = 1 << 20
)

// Pool is what replication needs of the node's pool: the streams and
// what is read, held and destroyed around them (libzfs and zfsfake
// implement all of zfs.Interface).
type Pool interface {
	zfs.Streams
	zfs.SnapshotLister
	zfs.PropertyReader
	zfs.Holds
	zfs.Destroyer
	SetProperties(ctx context.Context, name string, props map[string]string) error
	Snapshot(ctx context.Context, name string, props map[string]string) error
	Rename(ctx context.Context, from, to string) error
}

// dataset returns the volume's dataset under root, refusing IDs that are
// not volume IDs.
func dataset(root, volumeID string) (string, error) {
	if !contract.IsVolumeID(volumeID) {
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", volumeID)
	}
	return root + "/" + volumeID, nil
}

// dropOldBases ends both tidies, after a push and after a receive, once
// the new base is held: it releases the base holds the new one
// superseded and prunes the replication snapshots beyond keep, sparing
// those in spare (bases a peer received whose hold is not placed yet).
// What fails is retried by the next transfer (a push or a receive, as
// next says).
func dropOldBases(ctx context.Context, z Pool, fs string, keep int, spare []string, next string, log hclog.Logger) {
	if err := releaseSuperseded(ctx, z, fs); err != nil {
		log.Warn("releasing old base holds failed; the next "+next+" retries", "error", err)
	}
	if err := copyrecord.Prune(ctx, z, fs, keep, spare...); err != nil {
		log.Warn("pruning old replication snapshots failed; the next "+next+" retries", "error", err)
	}
}

// releaseSuperseded releases every base hold of fs that a newer snapshot
// carries too: only the newest snapshot held with a tag is the base it
// names. After a transfer, tidy holds the new base and only then runs
// this, so some common snapshot is held at every moment, and the answer
// to the transfer waits for neither sync task.
func releaseSuperseded(ctx context.Context, z Pool, fs string) error {
	snaps, err := z.Snapshots(ctx, fs) // oldest first
	if err != nil {
		return err
	}
	holds, err := z.Holds(ctx, fs)
	if err != nil {
		return fmt.Errorf("listing holds on %s: %w", fs, err)
	}
	newest := map[string]string{} // tag -> newest snapshot holding it
	for _, s := range snaps {
		for _, t := range holds[s.Name] {
			if isBaseTag(t) {
				newest[t] = s.Name
			}
		}
	}
	for _, s := range snaps {
		for _, t := range holds[s.Name] {
			if isBaseTag(t) && newest[t] != s.Name {
				if err := z.Release(ctx, s.Name, t); err != nil && !errors.Is(err, zfs.ErrNotFound) {
					return fmt.Errorf("releasing the old base %s: %w", s.Name, err)
				}
			}
		}
	}
	return nil
}

// isBaseTag selects the holds that protect incremental bases.
func isBaseTag(tag string) bool { return tag == BaseHoldTag || isPeerTag(tag) }

// peerTag is the hold tag of peer's base.
func peerTag(peer string) string { return copyrecord.PeerBaseTag(peer) }

// isPeerTag selects a sender's per-peer base holds.
func isPeerTag(tag string) bool { return strings.HasPrefix(tag, peerTag("")) }

// streamedTag is the hold tag of the first snapshot streamed to peer
// while it carried no tag here (streamed.go).
func streamedTag(peer string) string { return copyrecord.PeerStreamedTag(peer) }

// isStreamedTag selects the holds streamedTag places.
func isStreamedTag(tag string) bool { return strings.HasPrefix(tag, streamedTag("")) }

// isReceiverTag selects a receiver's base hold.
func isReceiverTag(tag string) bool { return tag == BaseHoldTag }
